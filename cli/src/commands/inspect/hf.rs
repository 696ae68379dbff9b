//! `stoker inspect` on a Hugging Face `datasets` folder: shards, record batches, columns with
//! their features, then the image statistics of the sample column.

use stoker_datasets::{HfDataset, HfFeature};

use super::{print_columnar, Column, Format, InspectArgs};

/// A feature in a few words.
fn feature_name(feature: Option<&HfFeature>) -> String {
    match feature {
        None => String::new(),
        Some(HfFeature::Image) => "Image".into(),
        Some(HfFeature::ClassLabel { names }) => format!("ClassLabel ({} names)", names.len()),
        Some(HfFeature::Value { dtype }) => format!("Value({dtype})"),
        Some(HfFeature::Other { kind }) => kind.clone(),
    }
}

/// Runs the command on a `save_to_disk` folder.
pub(super) fn inspect_hf(args: &InspectArgs) -> anyhow::Result<()> {
    let dataset = HfDataset::open(&args.data, &args.columns())?;
    print_columnar(
        args,
        &dataset,
        &dataset.summary(),
        Format {
            names: ("hf", "hugging face datasets"),
            chunks: ("record_batches", "record batches"),
        },
        |column| Column {
            name: &column.name,
            data_type: &column.data_type,
            feature: Some(feature_name(column.feature.as_ref())),
        },
    )
}
