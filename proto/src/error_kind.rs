//! The kinds Stoker's errors fall into, the same whether an error happened in this process or
//! came back from a daemon over gRPC (in the `stoker-error-kind` metadata of its status, by
//! [`ErrorKind::as_str`]), so callers, and Python's exception classes, can tell a missing dataset
//! from a corrupt sample in both modes. Here, below every crate that makes or reads errors.

/// What went wrong, as callers tell errors apart. Travels with every error a daemon returns
/// (the `stoker-error-kind` metadata of its gRPC status), so remote errors keep their kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    /// A request or setting is not acceptable (bad spec, out-of-range value).
    InvalidArgument,
    /// A path that does not exist.
    NotFound,
    /// A path that is not a directory where one is needed.
    NotADirectory,
    /// A dataset that cannot be opened, indexed or read.
    Dataset,
    /// A sample that cannot be decoded (under the fail policy).
    Decode,
    /// A pipeline the workers refuse.
    Pipeline,
    /// A wait that passed its deadline.
    Timeout,
    /// A request the daemon is not allowed to serve (a path outside `--data-root`).
    PermissionDenied,
    /// No worker serves the job.
    WorkerUnavailable,
    /// The caller interrupted a wait.
    Interrupted,
    /// A daemon refused the call's token: none was given, or not one it accepts.
    Unauthenticated,
    /// The TLS connection failed: a certificate from an unknown CA or for another name, or one
    /// side speaking TLS and the other plaintext.
    Tls,
    /// Anything else: the loader stopped, a daemon failed internally.
    Internal,
}

/// Every kind.
pub const ERROR_KINDS: [ErrorKind; 13] = [
    ErrorKind::InvalidArgument,
    ErrorKind::NotFound,
    ErrorKind::NotADirectory,
    ErrorKind::Dataset,
    ErrorKind::Decode,
    ErrorKind::Pipeline,
    ErrorKind::Timeout,
    ErrorKind::PermissionDenied,
    ErrorKind::WorkerUnavailable,
    ErrorKind::Interrupted,
    ErrorKind::Unauthenticated,
    ErrorKind::Tls,
    ErrorKind::Internal,
];

impl ErrorKind {
    /// The name it travels as.
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorKind::InvalidArgument => "invalid_argument",
            ErrorKind::NotFound => "not_found",
            ErrorKind::NotADirectory => "not_a_directory",
            ErrorKind::Dataset => "dataset",
            ErrorKind::Decode => "decode",
            ErrorKind::Pipeline => "pipeline",
            ErrorKind::Timeout => "timeout",
            ErrorKind::PermissionDenied => "permission_denied",
            ErrorKind::WorkerUnavailable => "worker_unavailable",
            ErrorKind::Interrupted => "interrupted",
            ErrorKind::Unauthenticated => "unauthenticated",
            ErrorKind::Tls => "tls",
            ErrorKind::Internal => "internal",
        }
    }

    /// The kind named `name`, if it is one.
    pub fn from_name(name: &str) -> Option<ErrorKind> {
        ERROR_KINDS.into_iter().find(|kind| kind.as_str() == name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_round_trip_by_name() {
        for kind in ERROR_KINDS {
            assert_eq!(ErrorKind::from_name(kind.as_str()), Some(kind));
        }
        assert_eq!(ErrorKind::from_name("no such kind"), None);
    }
}
