//! One pool of threads serves every FUSE session of the process. A session costs its device
//! descriptor and a small record, not threads of its own: the threads wait on one epoll over
//! every session's device, each takes one request, answers it, and waits again. A runner's
//! threads therefore stay at the pool's size however many workspaces are mounted
//! (`cargo bench --bench scale`).
//!
//! Fairness: a session's device is armed for one reader at a time (`EPOLLONESHOT`), and
//! re-armed only while fewer than its share of the pool answer it (at most 2 of at least 8
//! for a workspace's mount), so one busy mount cannot take every thread from the others. A
//! thread is never held long: requests are answered from the store on this machine.

use crate::device::Device;
use nix::errno::Errno;
use nix::sys::epoll::{Epoll, EpollCreateFlags, EpollEvent, EpollFlags, EpollTimeout};
use std::collections::HashMap;
use std::io;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::time::Duration;

/// Room for any request a read-only file system is sent: the kernel wants room for a write
/// of `max_write` (4 KiB, the least it accepts) after the headers, and no other request this
/// file system gets is longer than a name or an ioctl's argument (at most 16 KiB). One
/// that would not fit is failed by the kernel alone, not by this side.
pub const REQUEST_BUFFER: usize = 64 * 1024 + 4096;

/// What answers a session's requests.
pub trait Answer: Send + Sync + 'static {
    /// Answers one request read from `session`'s device (each request gets at most one
    /// reply, through [`Session::reply`]).
    fn answer(&self, session: &Session, request: &[u8]);
}

/// A mounted file system's connection: its device, what answers it, and whether it ended.
pub struct Session {
    key: u64,
    device: Device,
    answer: Box<dyn Answer>,
    /// Threads answering it now, and the most that may at once.
    busy: AtomicU32,
    share: u32,
    ended: Mutex<bool>,
    ended_cv: Condvar,
}

impl Session {
    /// Sends the reply to request `unique`: `error` a negative errno (and no data), or 0 and
    /// the reply's parts after the header. A request the kernel no longer waits for
    /// (interrupted, or its mount gone) is not an error.
    pub fn reply(&self, unique: u64, error: i32, parts: &[&[u8]]) {
        let len: usize = parts.iter().map(|p| p.len()).sum();
        let header = crate::abi::out_header(len, error, unique);
        self.write(&header, parts);
    }

    /// Sends a notification (`code`, and its payload) to the kernel: `Err` where the kernel
    /// refused it (an entry it no longer has: `ENOENT`).
    pub fn notify(&self, code: i32, payload: &[&[u8]]) -> io::Result<()> {
        let len: usize = payload.iter().map(|p| p.len()).sum();
        let header = crate::abi::out_header(len, code, 0);
        self.write_all(&header, payload)
    }

    fn write(&self, header: &[u8], parts: &[&[u8]]) {
        match self.write_all(header, parts) {
            Ok(()) => {}
            Err(e)
                if matches!(
                    e.raw_os_error(),
                    Some(nix::libc::ENOENT | nix::libc::ENODEV)
                ) => {}
            Err(e) => tracing::debug!(error = %e, "a FUSE reply was refused"),
        }
    }

    fn write_all(&self, header: &[u8], parts: &[&[u8]]) -> io::Result<()> {
        // No allocation per reply: a reply here has at most three parts after its header.
        let mut slices = [io::IoSlice::new(&[]); 4];
        if parts.len() >= slices.len() {
            return Err(io::Error::other("a FUSE reply of too many parts"));
        }
        slices[0] = io::IoSlice::new(header);
        for (slice, part) in slices[1..].iter_mut().zip(parts) {
            *slice = io::IoSlice::new(part);
        }
        // The device takes a whole reply in one write, or none of it.
        nix::sys::uio::writev(&self.device.fd, &slices[..=parts.len()])?;
        Ok(())
    }

    /// Whether its mount still serves: false once the kernel has ended the connection.
    pub fn is_served(&self) -> bool {
        !*self.ended.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Waits up to `wait` for the connection to end (after an unmount); whether it has.
    pub fn wait_end(&self, wait: Option<Duration>) -> bool {
        let ended = self.ended.lock().unwrap_or_else(|p| p.into_inner());
        match wait {
            None => {
                let ended = self.ended_cv.wait_while(ended, |e| !*e);
                drop(ended);
                true
            }
            Some(wait) => {
                let ended = self.ended_cv.wait_timeout_while(ended, wait, |e| !*e);
                match ended {
                    Ok((e, _)) => *e,
                    Err(p) => *p.into_inner().0,
                }
            }
        }
    }
}

struct Pool {
    epoll: Epoll,
    sessions: Mutex<HashMap<u64, Arc<Session>>>,
    next_key: AtomicU64,
    threads: usize,
    /// Threads started so far: topped up by each new session until all run (a system out
    /// of threads at the first mount must not leave later ones served by none).
    started: Mutex<usize>,
}

static POOL: OnceLock<Pool> = OnceLock::new();

/// The pool's threads: enough that a few slow requests (a file read from a cold disk) do not
/// hold up the other mounts, and few enough to cost little where nothing is mounted busy.
/// Every request is answered from the store on this machine (no network, no lock held
/// across requests), so a thread is never held long.
pub fn threads() -> usize {
    let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
    (2 * cores).clamp(8, 64)
}

fn pool() -> io::Result<&'static Pool> {
    let pool = match POOL.get() {
        Some(p) => p,
        None => {
            let made = Pool {
                epoll: Epoll::new(EpollCreateFlags::EPOLL_CLOEXEC)?,
                sessions: Mutex::new(HashMap::new()),
                next_key: AtomicU64::new(1),
                threads: threads(),
                started: Mutex::new(0),
            };
            // Another caller may have made it meanwhile: theirs is kept, this one dropped.
            POOL.get_or_init(|| made)
        }
    };
    let mut started = pool.started.lock().unwrap_or_else(|p| p.into_inner());
    while *started < pool.threads {
        let spawned = std::thread::Builder::new()
            .name(format!("fuse-{}", *started))
            .spawn(move || work(pool));
        match spawned {
            Ok(_) => *started += 1,
            Err(e) if *started == 0 => return Err(e),
            // Fewer for now; the next session tries again.
            Err(e) => {
                tracing::warn!(error = %e, started = *started, "the FUSE pool has fewer threads than it should");
                break;
            }
        }
    }
    Ok(pool)
}

/// Serves `device` with `answer` from the pool, at most `share` requests at once.
pub fn serve(device: Device, answer: Box<dyn Answer>, share: usize) -> io::Result<Arc<Session>> {
    let pool = pool()?;
    let key = pool.next_key.fetch_add(1, Ordering::Relaxed);
    let session = Arc::new(Session {
        key,
        device,
        answer,
        busy: AtomicU32::new(0),
        share: share.clamp(1, pool.threads) as u32,
        ended: Mutex::new(false),
        ended_cv: Condvar::new(),
    });
    pool.sessions
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .insert(key, session.clone());
    if let Err(e) = pool.epoll.add(&session.device.fd, armed(key)) {
        pool.sessions
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&key);
        return Err(e.into());
    }
    Ok(session)
}

/// How many sessions the pool serves now.
pub fn sessions() -> usize {
    POOL.get().map_or(0, |p| {
        p.sessions.lock().unwrap_or_else(|p| p.into_inner()).len()
    })
}

fn armed(key: u64) -> EpollEvent {
    EpollEvent::new(EpollFlags::EPOLLIN | EpollFlags::EPOLLONESHOT, key)
}

impl Pool {
    /// Lets the next request of `session` be taken by a waiting thread.
    fn arm(&self, session: &Session) {
        let mut event = armed(session.key);
        // ENOENT: the session ended meanwhile, and left the epoll.
        let _ = self.epoll.modify(&session.device.fd, &mut event);
    }

    fn end(&self, session: &Session) {
        let _ = self.epoll.delete(&session.device.fd);
        self.sessions
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&session.key);
        *session.ended.lock().unwrap_or_else(|p| p.into_inner()) = true;
        session.ended_cv.notify_all();
    }
}

fn work(pool: &'static Pool) {
    let mut buffer = vec![0u8; REQUEST_BUFFER];
    let mut events = [EpollEvent::empty()];
    // Bounded, so a thread with nothing to do still gives back what it holds (memory::idle).
    let look = EpollTimeout::try_from(cloud_harness_memory::idle::LOOK_EVERY)
        .unwrap_or(EpollTimeout::NONE);
    loop {
        // After a request or a wait that timed out: one atomic load unless asked.
        cloud_harness_memory::idle::at_idle();
        match pool.epoll.wait(&mut events, look) {
            Ok(0) | Err(Errno::EINTR) => continue,
            Ok(_) => {}
            Err(e) => {
                // Not expected of a valid epoll; not a reason to spin.
                tracing::error!(error = %e, "waiting for FUSE requests");
                std::thread::sleep(Duration::from_millis(100));
                continue;
            }
        }
        let key = events[0].data();
        let session = pool
            .sessions
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&key)
            .cloned();
        if let Some(session) = session {
            take_one(pool, &session, &mut buffer);
        }
    }
}

/// Reads one request of `session` and answers it.
fn take_one(pool: &Pool, session: &Session, buffer: &mut [u8]) {
    match nix::unistd::read(&session.device.fd, buffer) {
        Ok(n) => {
            let busy = session.busy.fetch_add(1, Ordering::AcqRel) + 1;
            if busy < session.share {
                pool.arm(session);
            }
            let request = &buffer[..n];
            let answered = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                session.answer.answer(session, request)
            }));
            if answered.is_err() {
                // A bug, not a reason to lose the thread or leave the caller waiting.
                tracing::error!("answering a FUSE request panicked; it gets EIO");
                if let Ok((header, _)) = crate::abi::parse(request) {
                    session.reply(header.unique, -nix::libc::EIO, &[]);
                }
            }
            // The thread that found the session at its share did not re-arm it: the first
            // to finish does.
            if session.busy.fetch_sub(1, Ordering::AcqRel) == session.share {
                pool.arm(session);
            }
        }
        // Taken by no one after all (another reader, an interrupted request): wait again.
        Err(Errno::EAGAIN | Errno::EINTR | Errno::ENOENT) => pool.arm(session),
        // The file system was unmounted (or its connection aborted).
        Err(Errno::ENODEV) => pool.end(session),
        // Not expected while the connection stands: ending the session would leave its mount
        // attached and unanswered, so it is read again, after a pause (no spinning).
        Err(e) => {
            tracing::error!(error = %e, "reading a FUSE request; reading again");
            std::thread::sleep(Duration::from_millis(10));
            pool.arm(session);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::{self, Attach};
    use crate::fuse::SkillsFs;
    use cloud_harness_skills::discovery::SkillCache;
    use cloud_harness_skills::generation::View;
    use cloud_harness_skills::namespace::Namespace;
    use cloud_harness_skills::stack::StackSpec;
    use cloud_harness_store::cas::Store;
    use std::path::Path;
    use std::sync::atomic::AtomicUsize;

    fn can_mount() -> bool {
        let root = nix::unistd::geteuid().is_root() && Path::new("/dev/fuse").exists();
        if !root {
            assert!(std::env::var_os("CI").is_none(), "needs root and /dev/fuse");
        }
        root
    }

    fn namespace(tmp: &Path) -> Arc<Namespace> {
        let store = Store::open(tmp.join("store")).unwrap();
        let generation = StackSpec::default()
            .generation(&store, &SkillCache::default())
            .unwrap();
        Arc::new(Namespace::new(store, View::Merged, Arc::new(generation)))
    }

    fn attach(at: &Path) -> Device {
        std::fs::create_dir_all(at).unwrap();
        let how = Attach {
            allow_other: false,
            auto_unmount: false,
        };
        device::attach(at, &how).unwrap()
    }

    /// Detaches its mount points when dropped, a failed test's too.
    struct Points(Vec<std::path::PathBuf>);

    impl Drop for Points {
        fn drop(&mut self) {
            for p in &self.0 {
                let _ = device::detach(p);
            }
        }
    }

    /// The threads of this process the pool started.
    fn pool_threads() -> usize {
        std::fs::read_dir("/proc/self/task")
            .unwrap()
            .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
            .filter(|name| name.starts_with("fuse-"))
            .count()
    }

    #[test]
    fn many_mounts_are_served_by_the_same_few_threads_and_each_ends_with_its_unmount() {
        if !can_mount() {
            return;
        }
        let tmp = tempfile::tempdir().unwrap();
        let ns = namespace(tmp.path());
        let points = Points((0..40).map(|i| tmp.path().join(format!("m{i}"))).collect());
        let served: Vec<_> = points
            .0
            .iter()
            .map(|p| serve(attach(p), Box::new(SkillsFs::new(ns.clone(), None)), 2).unwrap())
            .collect();
        let names = |p: &Path| -> Vec<_> {
            let mut n: Vec<_> = std::fs::read_dir(p)
                .unwrap()
                .map(|e| e.unwrap().file_name())
                .collect();
            n.sort();
            n
        };
        let expected = names(&points.0[0]);
        assert!(!expected.is_empty());
        for p in &points.0 {
            // Served: a listing and a stat come back (a mount nobody serves would hang).
            assert_eq!(names(p), expected, "{}", p.display());
            assert!(std::fs::metadata(p).unwrap().is_dir());
        }
        assert_eq!(sessions(), 40);
        assert_eq!(pool_threads(), threads(), "threads grew with the mounts");
        for (p, s) in points.0.iter().zip(&served) {
            assert!(s.is_served());
            device::detach(p).unwrap();
            assert!(s.wait_end(Some(Duration::from_secs(10))), "{}", p.display());
            assert!(!s.is_served());
        }
        assert_eq!(sessions(), 0);
        assert_eq!(pool_threads(), threads());
    }

    /// Panics at a lookup of a name starting with "boom" (a bug in a handler); answers the
    /// rest.
    struct Boom(SkillsFs);

    impl Answer for Boom {
        fn answer(&self, session: &Session, request: &[u8]) {
            let (header, mut args) = crate::abi::parse(request).unwrap();
            if header.opcode == crate::abi::op::LOOKUP
                && args.name().unwrap().as_encoded_bytes().starts_with(b"boom")
            {
                panic!("a handler's bug");
            }
            self.0.answer(session, request);
        }
    }

    #[test]
    fn a_handler_that_panics_answers_eio_and_the_mount_goes_on_serving() {
        if !can_mount() {
            return;
        }
        let tmp = tempfile::tempdir().unwrap();
        let ns = namespace(tmp.path());
        let points = Points(vec![tmp.path().join("boom")]);
        let at = &points.0[0];
        let served = serve(attach(at), Box::new(Boom(SkillsFs::new(ns, None))), 2).unwrap();
        for _ in 0..2 * threads() {
            let e = std::fs::metadata(at.join("boom-1")).unwrap_err();
            assert_eq!(e.raw_os_error(), Some(nix::libc::EIO), "{e}");
        }
        // No thread was lost to the panics, and the mount still answers.
        assert_eq!(pool_threads(), threads());
        assert!(std::fs::read_dir(at).is_ok());
        assert!(matches!(
            std::fs::metadata(at.join("absent")).map_err(|e| e.kind()),
            Err(std::io::ErrorKind::NotFound)
        ));
        device::detach(at).unwrap();
        assert!(served.wait_end(Some(Duration::from_secs(10))));
    }

    /// Answers lookups of names starting with "slow" after a long wait, the rest at once.
    struct Slow {
        fs: SkillsFs,
        answered: Arc<AtomicUsize>,
    }

    impl Answer for Slow {
        fn answer(&self, session: &Session, request: &[u8]) {
            let (header, mut args) = crate::abi::parse(request).unwrap();
            if header.opcode == crate::abi::op::LOOKUP
                && args.name().unwrap().as_encoded_bytes().starts_with(b"slow")
            {
                std::thread::sleep(Duration::from_secs(2));
                self.answered.fetch_add(1, Ordering::SeqCst);
            }
            self.fs.answer(session, request);
        }
    }

    #[test]
    fn a_mount_whose_requests_are_slow_holds_no_more_than_its_share_of_the_threads() {
        if !can_mount() {
            return;
        }
        let tmp = tempfile::tempdir().unwrap();
        let ns = namespace(tmp.path());
        let (slow_at, other_at) = (tmp.path().join("slow"), tmp.path().join("other"));
        let answered = Arc::new(AtomicUsize::new(0));
        let slow = Slow {
            fs: SkillsFs::new(ns.clone(), None),
            answered: answered.clone(),
        };
        let points = Points(vec![slow_at.clone(), other_at.clone()]);
        let slow = serve(attach(&slow_at), Box::new(slow), 2).unwrap();
        let other = serve(attach(&other_at), Box::new(SkillsFs::new(ns, None)), 2).unwrap();
        // More slow lookups at once than the pool has threads.
        let callers: Vec<_> = (0..threads() + 1)
            .map(|i| {
                let path = slow_at.join(format!("slow{i}"));
                std::thread::spawn(move || std::fs::metadata(path).is_err())
            })
            .collect();
        std::thread::sleep(Duration::from_millis(300));
        // The other mount is answered while the slow one's lookups are still waiting.
        let looked_up = std::fs::metadata(other_at.join("anything")).is_err();
        let listed = std::fs::read_dir(&other_at).map(|d| d.count());
        let slow_answered_before = answered.load(Ordering::SeqCst);
        // Every caller joined before anything can fail: a process that ends while its own
        // mount holds a request of its own can never end (the kernel waits for the answer).
        let not_found: Vec<bool> = callers.into_iter().map(|c| c.join().unwrap()).collect();
        assert_eq!(
            slow_answered_before, 0,
            "the other mount waited for the slow one"
        );
        assert!(looked_up && listed.is_ok());
        assert!(
            not_found.iter().all(|&n| n),
            "a name that is not there was found"
        );
        assert_eq!(answered.load(Ordering::SeqCst), threads() + 1);
        drop(points);
        for s in [&slow, &other] {
            assert!(s.wait_end(Some(Duration::from_secs(10))));
        }
    }
}
