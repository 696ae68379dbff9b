//! `stoker inspect` on a Hugging Face `datasets` folder: shards, record batches, columns with
//! their features, then the image statistics of the sample column.

use stoker_datasets::{inspect_samples, HfDataset, HfFeature, ParquetOptions, ParquetSampleKind};
use stoker_worker::DEFAULT_MAX_PIXELS;

use super::{print_report, InspectArgs};

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
    let dataset = HfDataset::open(&args.data, &ParquetOptions::default())?;
    let summary = dataset.summary();
    let report = match summary.sample_kind {
        ParquetSampleKind::Image => Some(inspect_samples(&dataset, DEFAULT_MAX_PIXELS)?),
        ParquetSampleKind::Text | ParquetSampleKind::Numeric => None,
    };
    if args.json {
        let columns: Vec<serde_json::Value> = summary
            .columns
            .iter()
            .map(|column| {
                serde_json::json!({
                    "name": column.name,
                    "type": column.data_type,
                    "feature": feature_name(column.feature.as_ref()),
                })
            })
            .collect();
        let json = serde_json::json!({
            "format": "hf",
            "files": summary.files,
            "rows": summary.rows,
            "record_batches": summary.record_batches,
            "file_bytes": summary.file_bytes,
            "columns": columns,
            "sample_column": summary.sample_column,
            "label_column": summary.label_column,
            "images": report,
        });
        println!("{json}");
        return Ok(());
    }
    println!("dataset   {} (hugging face datasets)", args.data.display());
    println!(
        "files     {} ({:.1} MB), {} record batches, {} rows",
        summary.files,
        summary.file_bytes as f64 / 1e6,
        summary.record_batches,
        summary.rows
    );
    println!("columns");
    for column in &summary.columns {
        let role = if column.name == summary.sample_column {
            match summary.sample_kind {
                ParquetSampleKind::Image => "  (images)",
                ParquetSampleKind::Text => "  (text)",
                ParquetSampleKind::Numeric => "",
            }
        } else if summary.label_column.as_deref() == Some(column.name.as_str()) {
            "  (labels)"
        } else {
            ""
        };
        let feature = feature_name(column.feature.as_ref());
        println!(
            "  {:<24} {:<28} {feature}{role}",
            column.name, column.data_type
        );
    }
    match report {
        Some(report) => print_report(&report),
        None => println!("samples   {}", summary.rows),
    }
    Ok(())
}
