//! Checks of what clients ask the coordinator daemon for, before the core sees it: a job spec
//! the daemon can schedule (the workers check the rest when they open the job).

use stoker_proto::v1::JobSpec;
use tonic::Status;

/// Refuses a spec with an absurd batch size or world size, or without a dataset (a mix: a
/// dataset for each source): [`stoker_pipeline::check_spec_shape`], as a gRPC status.
pub(super) fn validate_spec(spec: &JobSpec) -> Result<(), Status> {
    stoker_pipeline::check_spec_shape(spec)
        .map_err(|error| Status::invalid_argument(error.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use stoker_proto::v1::DatasetSource;

    #[test]
    fn absurd_specs_are_refused_by_name() {
        let good = JobSpec {
            dataset: Some(DatasetSource {
                uri: "/data".into(),
                ..DatasetSource::default()
            }),
            batch_size: 8,
            world_size: 1,
            ..JobSpec::default()
        };
        assert!(validate_spec(&good).is_ok());
        let no_batch = JobSpec {
            batch_size: 0,
            ..good.clone()
        };
        assert!(validate_spec(&no_batch)
            .unwrap_err()
            .message()
            .contains("batch_size"));
        let too_wide = JobSpec {
            world_size: stoker_pipeline::MAX_WORLD_SIZE + 1,
            ..good.clone()
        };
        assert!(validate_spec(&too_wide)
            .unwrap_err()
            .message()
            .contains("world_size"));
        let no_data = JobSpec {
            dataset: None,
            ..good
        };
        assert!(validate_spec(&no_data).is_err());
    }
}
