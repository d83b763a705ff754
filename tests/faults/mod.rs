//! Faults survived with nothing lost.
//!
//! The crash suite: `serve` (and `cas gc`) is killed with SIGKILL in the middle of real work —
//! at named kill points (compiled into the tests' binary, `CLOUD_HARNESS_KILL_AT`, see
//! `cloud_harness_error::failpoint`) and at random moments (seeded: `CRASH_SEED=N` replays a
//! run) — and started again on the same home and store. After every kill, before the restart,
//! no mount of it and no process of it is left (`aftermath::settled`); after every restart,
//! nothing half-made is (`aftermath::whole`), and the interrupted call, retried with its
//! idempotency key, gives one workspace. Each test prints its kill points and restarts.
//!
//! Damaged state (`damaged`) and full disks (`disks`): a clear refusal naming the file or the
//! condition, nothing published half, and the same call succeeding once the fault is gone.

pub(crate) mod aftermath;
mod collection;
mod curation;
mod damaged;
mod disks;
mod import;
mod opens;
mod services;
pub(crate) mod site;
mod toolkits;
