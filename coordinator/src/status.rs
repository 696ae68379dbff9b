//! The coordinator's side of the error/status table (the rest is
//! `stoker_rpc::error_kinds`): the status each refusal of the core travels as.

use stoker_pipeline::ErrorKind;
use stoker_rpc::error_kinds::{status, with_kind};
use tonic::Status;

use crate::CoordinatorError;

/// The status a coordinator refusal travels as.
pub fn coordinator_status(error: CoordinatorError) -> Status {
    let message = error.to_string();
    let kind = match error {
        CoordinatorError::UnknownJob(_)
        | CoordinatorError::UnknownWorker(_)
        | CoordinatorError::UnknownSession(_)
        | CoordinatorError::UnknownLease(_) => {
            // Not a missing file: a name the coordinator does not know (the code says so).
            return with_kind(Status::not_found(message), ErrorKind::InvalidArgument);
        }
        CoordinatorError::WorkerExpired(_) | CoordinatorError::SessionClosed(_) => {
            return with_kind(
                Status::failed_precondition(message),
                ErrorKind::InvalidArgument,
            );
        }
        CoordinatorError::TooManySessions { .. } => {
            // No kind of its own: to a client it is the service being unable to serve now.
            return with_kind(
                Status::resource_exhausted(message),
                ErrorKind::WorkerUnavailable,
            );
        }
        CoordinatorError::LeaseNotHeld { .. } => ErrorKind::PermissionDenied,
        CoordinatorError::InvalidCredits { .. }
        | CoordinatorError::StepOutOfRange { .. }
        | CoordinatorError::RankOutOfRange { .. }
        | CoordinatorError::InvalidArgument(_) => ErrorKind::InvalidArgument,
        CoordinatorError::Journal(_)
        | CoordinatorError::JournalDamaged { .. }
        | CoordinatorError::StateDir { .. }
        | CoordinatorError::CorruptSpec { .. }
        | CoordinatorError::CorruptPositions { .. } => ErrorKind::Internal,
    };
    status(kind, message)
}
