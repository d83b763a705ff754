//! What happens to a command started in an executor, whatever the backend: its output as
//! chunks per stream, the output's end, and its exit.

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stream {
    Stdout,
    Stderr,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Exit {
    pub code: Option<i32>,
    pub signal: Option<i32>,
    /// The executor's agent went away before the command's exit was known.
    pub lost: bool,
}

/// What happens to a started command: output chunks in order per stream, the output's end,
/// the command's exit (these two in either order).
#[derive(Debug, PartialEq, Eq)]
pub enum Event {
    Output(Stream, Vec<u8>),
    Closed,
    Exited(Exit),
}
