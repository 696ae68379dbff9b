//! The one two-way table between our errors and gRPC statuses: a status carries a code (for
//! gRPC tooling) and, in its [`KIND_METADATA`] entry, the exact [`ErrorKind`], which the client
//! turns back into the same kind of error (a code alone cannot: every dataset error is
//! `FAILED_PRECONDITION`); and the refusals ([`Refusal`]) a daemon or the client's own connector
//! gives for a token or a TLS setting, found again behind a failed call. Below
//! [`crate::security`], which uses it; the services use it beside [`crate::transport`].

use tonic::{Code, Status};

use stoker_proto::ErrorKind;

/// The status metadata entry that carries an error's [`ErrorKind`].
pub const KIND_METADATA: &str = "stoker-error-kind";

/// How a daemon or a client was refused; [`Refusal::kind`] is the error kind it travels as.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// The daemon wants a token and the call carried none.
    MissingToken,
    /// The call's token is not one the daemon accepts.
    WrongToken,
    /// A plaintext client reached a daemon that serves TLS only.
    PlaintextToTls,
    /// A TLS client reached a daemon that serves plaintext.
    TlsToPlaintext,
    /// The daemon's certificate is not signed by the CA the client trusts.
    UnknownCa,
    /// The daemon's certificate does not name the host the client dialled.
    WrongName,
    /// Any other failed TLS handshake.
    Handshake,
}

impl Refusal {
    /// The kind of error a refusal is.
    pub fn kind(self) -> ErrorKind {
        match self {
            Refusal::MissingToken | Refusal::WrongToken => ErrorKind::Unauthenticated,
            _ => ErrorKind::Tls,
        }
    }
}

/// A refused connection, as the client's connector reports it: tonic passes it through as the
/// source of an `UNAVAILABLE` status, where [`refusal_of`] finds it again.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{message}")]
pub struct Refused {
    /// Which refusal.
    pub refusal: Refusal,
    /// What happened, and what to change.
    pub message: String,
}

/// The connector's refusal behind a failed call, if one is.
pub fn refusal_of(status: &Status) -> Option<&Refused> {
    let mut source = std::error::Error::source(status);
    while let Some(error) = source {
        if let Some(refused) = error.downcast_ref::<Refused>() {
            return Some(refused);
        }
        source = error.source();
    }
    None
}

/// Whether a failed call means the peer is (maybe only for now) unreachable, so retrying after a
/// backoff makes sense.
pub fn is_transient(status: &Status) -> bool {
    refusal_of(status).is_none()
        && matches!(
            status.code(),
            Code::Unavailable
                | Code::Unknown
                | Code::Cancelled
                | Code::DeadlineExceeded
                | Code::Aborted
        )
}

/// Whether a failed call was refused for its token or its TLS (by the daemon, or by the
/// client's own check of the daemon's certificate): a setting to fix, never worth a retry.
pub fn is_refusal(status: &Status) -> bool {
    matches!(
        kind_of_status(status),
        ErrorKind::Unauthenticated | ErrorKind::Tls
    )
}

/// The gRPC code an error of `kind` travels with.
fn code_of(kind: ErrorKind) -> Code {
    match kind {
        ErrorKind::InvalidArgument | ErrorKind::Pipeline => Code::InvalidArgument,
        ErrorKind::NotFound => Code::NotFound,
        ErrorKind::NotADirectory | ErrorKind::Dataset => Code::FailedPrecondition,
        ErrorKind::Decode => Code::DataLoss,
        ErrorKind::Timeout => Code::DeadlineExceeded,
        ErrorKind::PermissionDenied => Code::PermissionDenied,
        ErrorKind::WorkerUnavailable => Code::Unavailable,
        ErrorKind::Interrupted => Code::Cancelled,
        ErrorKind::Unauthenticated | ErrorKind::Tls => Code::Unauthenticated,
        ErrorKind::Internal => Code::Internal,
    }
}

/// The kind a status without [`KIND_METADATA`] (from tonic itself, or an older daemon) is
/// taken as.
fn kind_of(code: Code) -> ErrorKind {
    match code {
        Code::InvalidArgument | Code::OutOfRange => ErrorKind::InvalidArgument,
        Code::NotFound => ErrorKind::NotFound,
        Code::FailedPrecondition => ErrorKind::Dataset,
        Code::DataLoss => ErrorKind::Decode,
        Code::DeadlineExceeded => ErrorKind::Timeout,
        Code::PermissionDenied => ErrorKind::PermissionDenied,
        Code::Unauthenticated => ErrorKind::Unauthenticated,
        Code::Cancelled => ErrorKind::Interrupted,
        _ => ErrorKind::Internal,
    }
}

/// A status for an error of `kind`: its code, its message and the kind in the metadata.
pub fn status(kind: ErrorKind, message: impl Into<String>) -> Status {
    with_kind(Status::new(code_of(kind), message), kind)
}

/// The kind of the error a status stands for: the client connector's refusal behind it, the
/// kind its daemon gave it in [`KIND_METADATA`], or else the one its code suggests.
pub fn kind_of_status(status: &Status) -> ErrorKind {
    if let Some(refused) = refusal_of(status) {
        return refused.refusal.kind();
    }
    status
        .metadata()
        .get(KIND_METADATA)
        .and_then(|value| value.to_str().ok())
        .and_then(ErrorKind::from_name)
        .unwrap_or_else(|| kind_of(status.code()))
}

/// `status` with `kind` in its metadata (its code stays as it is).
pub fn with_kind(mut status: Status, kind: ErrorKind) -> Status {
    status.metadata_mut().insert(
        KIND_METADATA,
        tonic::metadata::MetadataValue::from_static(kind.as_str()),
    );
    status
}

/// The status metadata entry a worker sets on the error it sends a client when it cannot open
/// the job's datasets itself (a path missing on its machine, outside its `--data-root`): another
/// worker may, so the client takes its batches from the others and fails only once every
/// worker listed has said so.
pub const UNOPENED_METADATA: &str = "stoker-job-unopened";

/// `status` marked as a worker's own failure to open the job ([`UNOPENED_METADATA`]).
pub fn job_unopened(mut status: Status) -> Status {
    status.metadata_mut().insert(
        UNOPENED_METADATA,
        tonic::metadata::MetadataValue::from_static("1"),
    );
    status
}

/// Whether `status` is a worker's own failure to open the job ([`job_unopened`]).
pub fn is_job_unopened(status: &Status) -> bool {
    status.metadata().contains_key(UNOPENED_METADATA)
}

/// The status metadata entry a worker sets on the error of one batch it could not build (a bad
/// sample under the fail policy, a failure of its own told once tried enough): the batch's step,
/// so the client fails that step alone, as the embedded loader does, and reads on past it.
pub const FAILED_STEP_METADATA: &str = "stoker-failed-step";

/// `status` as the error of the batch of `step` ([`FAILED_STEP_METADATA`]).
pub fn failed_step_of(mut status: Status, step: u64) -> Status {
    status.metadata_mut().insert(
        FAILED_STEP_METADATA,
        tonic::metadata::MetadataValue::from(step),
    );
    status
}

/// The step whose batch `status` is the error of, if it is one ([`failed_step_of`]).
pub fn failed_step(status: &Status) -> Option<u64> {
    status
        .metadata()
        .get(FAILED_STEP_METADATA)
        .and_then(|value| value.to_str().ok())
        .and_then(|step| step.parse().ok())
}

/// The status metadata entry a coordinator sets on a transient error it relays from a worker
/// it could not reach while checking a job (the coordinator itself answered).
pub const WORKER_UNREACHABLE_METADATA: &str = "stoker-worker-unreachable";

/// `status` marked as the coordinator's failure to reach a worker ([`WORKER_UNREACHABLE_METADATA`]).
pub fn worker_unreachable(mut status: Status) -> Status {
    status.metadata_mut().insert(
        WORKER_UNREACHABLE_METADATA,
        tonic::metadata::MetadataValue::from_static("1"),
    );
    status
}

/// Whether `status` is a coordinator's failure to reach a worker ([`worker_unreachable`]).
pub fn is_worker_unreachable(status: &Status) -> bool {
    status.metadata().contains_key(WORKER_UNREACHABLE_METADATA)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_survives_the_wire() {
        for kind in stoker_proto::ERROR_KINDS {
            assert_eq!(kind_of_status(&status(kind, "why")), kind);
        }
        assert_eq!(
            kind_of_status(&Status::data_loss("corrupt")),
            ErrorKind::Decode
        );
    }

    #[test]
    fn a_batchs_error_carries_its_step_and_keeps_its_kind() {
        let failed = failed_step_of(status(ErrorKind::Decode, "a.jpg is corrupt"), 41);
        assert_eq!(failed_step(&failed), Some(41));
        assert_eq!(kind_of_status(&failed), ErrorKind::Decode);
        assert_eq!(failed_step(&status(ErrorKind::Decode, "no step")), None);
        let mut garbled = Status::internal("x");
        garbled.metadata_mut().insert(
            FAILED_STEP_METADATA,
            tonic::metadata::MetadataValue::from_static("forty"),
        );
        assert_eq!(failed_step(&garbled), None);
    }

    #[test]
    fn token_refusals_are_unauthenticated_and_the_rest_tls() {
        assert_eq!(Refusal::MissingToken.kind(), ErrorKind::Unauthenticated);
        assert_eq!(Refusal::WrongToken.kind(), ErrorKind::Unauthenticated);
        for refusal in [
            Refusal::PlaintextToTls,
            Refusal::TlsToPlaintext,
            Refusal::UnknownCa,
            Refusal::WrongName,
            Refusal::Handshake,
        ] {
            assert_eq!(refusal.kind(), ErrorKind::Tls);
        }
    }

    #[test]
    fn a_refusal_is_found_behind_a_status() {
        let refused = Refused {
            refusal: Refusal::UnknownCa,
            message: "not our CA".into(),
        };
        let status = tonic::Status::from_error(Box::new(tonic::ConnectError(Box::new(refused))));
        assert_eq!(
            refusal_of(&status).map(|r| r.refusal),
            Some(Refusal::UnknownCa)
        );
        assert!(refusal_of(&tonic::Status::unavailable("down")).is_none());
    }
}
