//! Checks of what clients ask the coordinator daemon for, before the core sees it: a job spec
//! the daemon can schedule (the workers check the rest when they open the job).

use stoker_proto::v1::JobSpec;
use stoker_worker::MAX_BATCH_SIZE;
use tonic::Status;

/// Ranks one coordinator serves per job at most.
const MAX_WORLD_SIZE: u32 = 1 << 20;

/// Refuses a spec with an absurd batch size or world size, or without a dataset (a mix: a
/// dataset for each source).
pub(super) fn validate_spec(spec: &JobSpec) -> Result<(), Status> {
    if spec.batch_size == 0 || spec.batch_size > MAX_BATCH_SIZE {
        return Err(Status::invalid_argument(format!(
            "batch_size must be in 1..={MAX_BATCH_SIZE}, got {}",
            spec.batch_size
        )));
    }
    let sources = stoker_worker::spec_sources(spec);
    let named = spec.mix.as_ref().map_or(1, |mix| mix.sources.len());
    if sources.is_empty() || sources.len() != named {
        return Err(Status::invalid_argument("job spec has no dataset"));
    }
    if sources
        .iter()
        .any(|(dataset, _)| dataset.uri.trim().is_empty())
    {
        return Err(Status::invalid_argument("dataset.uri is empty"));
    }
    if spec.world_size > MAX_WORLD_SIZE {
        return Err(Status::invalid_argument(format!(
            "world_size {} is more ranks than one coordinator serves (at most {})",
            spec.world_size, MAX_WORLD_SIZE
        )));
    }
    Ok(())
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
            world_size: MAX_WORLD_SIZE + 1,
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
