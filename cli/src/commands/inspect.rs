//! `stoker inspect`: samples, classes, formats and size statistics of a dataset.

mod hf;

use std::path::PathBuf;

use clap::Args;
use stoker_datasets::{
    inspect_image_folder, inspect_samples, resolve_local, ColumnarSummary, DatasetReport,
    ImageFolder, JsonlDocuments, LocalFormat, LocalSource, ParquetDataset, ParquetOptions,
    ParquetSampleKind, SampleSource,
};
use stoker_datasets::{TokenDtype, TokenFile};
use stoker_pipeline::DEFAULT_MAX_PIXELS;
use stoker_proto::v1::{self as proto, DatasetSource};

/// Arguments of `stoker inspect`.
#[derive(Debug, Args)]
pub struct InspectArgs {
    /// The source, named as a job names it: an ImageFolder root, tar shards (a folder of
    /// `*.tar` or one file), Parquet (a folder of `*.parquet` or one file), a Hugging Face
    /// `save_to_disk` folder, MDS shards, a token file (`*.bin`), a Megatron corpus (its `.bin`
    /// or `.idx`), JSONL (a `.jsonl` file or a folder of them), a pattern or list of files, or
    /// an `s3://` prefix or object.
    #[arg(long)]
    pub data: PathBuf,
    /// Token files: the window length to count windows for.
    #[arg(long, default_value_t = 1024)]
    pub seq_len: u32,
    /// Token files: element type (auto: from the file name).
    #[arg(long, default_value = "auto", value_parser = ["auto", "uint16", "uint32"])]
    pub token_dtype: String,
    /// JSONL: the text field.
    #[arg(long, default_value = "text")]
    pub text_field: String,
    /// Parquet, Hugging Face folders and MDS sets: the image column (default: found as a job
    /// finds it).
    #[arg(long)]
    pub image_column: Option<String>,
    /// Print one JSON object instead of text.
    #[arg(long)]
    pub json: bool,
    /// The split to inspect of a folder laid out by split (which is never inspected whole,
    /// as it is never read whole).
    #[arg(long)]
    pub split: Option<String>,
}

impl InspectArgs {
    /// The columns a Parquet file or a Hugging Face folder is read with: the image column
    /// named, else found as a job finds it.
    fn columns(&self) -> ParquetOptions {
        ParquetOptions {
            image_column: self.image_column.clone(),
            ..ParquetOptions::default()
        }
    }
}

/// Runs the command: a source is found as a job finds it (a pattern, a list, a split), then
/// described by its format.
pub fn run(args: InspectArgs) -> anyhow::Result<()> {
    let uri = args.data.to_string_lossy().into_owned();
    let named = |uri: &str| DatasetSource {
        uri: uri.to_string(),
        split: args.split.clone().unwrap_or_default(),
        image_column: args.image_column.clone().unwrap_or_default(),
        ..Default::default()
    };
    if uri.starts_with("s3://") {
        return inspect_opened(&args, &named(&uri), &[], "through the local object cache");
    }
    let path = match resolve_local(&[&uri], args.split.as_deref())? {
        LocalSource::Path(path) => path,
        // Described by their kind, as a job reads them: JSONL as documents, token files as
        // windows, the rest as samples.
        LocalSource::Files { name, files } => {
            return match stoker_datasets::kind_of_files(&name, &files)? {
                stoker_datasets::FileKind::Jsonl => {
                    let documents = JsonlDocuments::open_listed(
                        std::path::Path::new(&name),
                        files,
                        &args.text_field,
                        "",
                    )?;
                    print_jsonl(&args, &name, &documents)
                }
                stoker_datasets::FileKind::TokenFile => {
                    let dataset = DatasetSource {
                        token_dtype: match args.token_dtype.as_str() {
                            "uint16" => proto::Dtype::Uint16,
                            "uint32" => proto::Dtype::Uint32,
                            _ => proto::Dtype::Unspecified,
                        } as i32,
                        ..named(&uri)
                    };
                    let windows = token_windows(args.seq_len);
                    inspect_opened(&args, &dataset, &[windows], "the token files it names")
                }
                _ => inspect_opened(&args, &named(&uri), &[], "the files it names"),
            };
        }
    };
    let here = || DatasetSource {
        uri: path.to_string_lossy().into_owned(),
        image_column: args.image_column.clone().unwrap_or_default(),
        ..Default::default()
    };
    // The format a job would read the path as, by the one rule every reader follows.
    let format = stoker_datasets::local_format(&path)?;
    if format == LocalFormat::TokenFile && super::is_megatron_corpus(&path) {
        return inspect_opened(
            &args,
            &here(),
            &[token_windows(args.seq_len)],
            "Megatron corpus",
        );
    }
    if format == LocalFormat::Mds {
        return inspect_opened(&args, &here(), &[], "MDS shards");
    }
    let args = InspectArgs { data: path, ..args };
    if format == LocalFormat::TokenFile {
        return inspect_tokens(&args);
    }
    if format == LocalFormat::Jsonl {
        return inspect_jsonl(&args);
    }
    if format == LocalFormat::TarShards {
        let shards = stoker_datasets::TarShards::open(&args.data)?;
        let stats = shards.index_stats();
        if args.json {
            let json = serde_json::json!({
                "format": "tar",
                "samples": shards.len(),
                "classes": shards.class_names().len(),
                "shards": stats.shards,
                "problems": stats.problems,
            });
            println!("{json}");
            return Ok(());
        }
        println!("dataset   {} (tar shards)", args.data.display());
        println!("samples   {}", shards.len());
        println!("classes   {}", shards.class_names().len());
        println!(
            "shards    {} ({} index files reused, {} built, {} problems)",
            stats.shards, stats.loaded_from_cache, stats.built, stats.problems
        );
        println!("(size statistics: name the shards with a pattern, e.g. folder/*.tar)");
        return Ok(());
    }
    if format == LocalFormat::HfDataset {
        return hf::inspect_hf(&args);
    }
    if format == LocalFormat::Parquet {
        return inspect_parquet(&args);
    }
    let folder = ImageFolder::open(&args.data)?;
    let report = inspect_image_folder(&folder, DEFAULT_MAX_PIXELS)?;
    if args.json {
        println!("{}", serde_json::to_string(&report)?);
        return Ok(());
    }
    println!("dataset   {}", args.data.display());
    print_report(&report);
    Ok(())
}

/// A source opened as a job opens it (`dataset`, read with `ops`; `how` says how, in the
/// report): an `s3://` prefix or object (through the local cache), the files a pattern, list or
/// split names, MDS shards, a Megatron corpus. A token source's windows, else samples, classes
/// and shards, then the image statistics read from every sample.
fn inspect_opened(
    args: &InspectArgs,
    dataset: &DatasetSource,
    ops: &[proto::Op],
    how: &str,
) -> anyhow::Result<()> {
    let source = stoker_pipeline::open_source(dataset, ops)?;
    if let Some(cache) = source.cache_stats() {
        eprintln!("{cache}");
    }
    if let Some(windows) = source.token_windows() {
        if args.json {
            let json = serde_json::json!({
                "format": "token windows",
                "windows": source.len(),
                "seq_len": windows.seq_len,
                "dtype": windows.dtype.name(),
            });
            println!("{json}");
            return Ok(());
        }
        println!("dataset   {} ({how})", dataset.uri);
        println!("dtype     {}", windows.dtype.name());
        println!(
            "windows   {} of {} tokens (seq_len {} + 1)",
            source.len(),
            windows.seq_len + 1,
            windows.seq_len
        );
        return Ok(());
    }
    let report = inspect_samples(source.as_ref(), DEFAULT_MAX_PIXELS)?;
    if args.json {
        println!("{}", serde_json::to_string(&report)?);
        return Ok(());
    }
    println!("dataset   {} ({how})", dataset.uri);
    println!("classes   {}", source.class_names().len());
    if let Some(shards) = source.shard_sizes() {
        println!("shards    {}", shards.len());
    }
    print_report(&report);
    Ok(())
}

/// Files, row groups and columns, then the image statistics of the sample column (read from
/// every row).
fn inspect_parquet(args: &InspectArgs) -> anyhow::Result<()> {
    let dataset = ParquetDataset::open(&args.data, &args.columns())?;
    print_columnar(
        args,
        &dataset,
        &dataset.summary(),
        Format {
            names: ("parquet", "parquet"),
            chunks: ("row_groups", "row groups"),
        },
        |column| Column {
            name: &column.name,
            data_type: &column.data_type,
            feature: None,
        },
    )
}

/// One column of a columnar dataset, as the command shows it.
struct Column<'a> {
    name: &'a str,
    data_type: &'a str,
    /// A Hugging Face feature, in words (`None` for Parquet, which has none).
    feature: Option<String>,
}

/// How the command names a columnar format.
struct Format {
    /// The format's name in JSON, and in words.
    names: (&'static str, &'static str),
    /// The chunks its rows are decoded in: their JSON key, and their name in words.
    chunks: (&'static str, &'static str),
}

/// Prints a columnar dataset: files, chunks and columns (each as `column` shows it), then the
/// image statistics of its sample column (read from every row) when it holds images, as text or
/// one JSON object.
fn print_columnar<'a, C>(
    args: &InspectArgs,
    dataset: &dyn SampleSource,
    summary: &'a ColumnarSummary<C>,
    format: Format,
    column: impl Fn(&'a C) -> Column<'a>,
) -> anyhow::Result<()> {
    let columns: Vec<Column<'a>> = summary.columns.iter().map(column).collect();
    let (sample_column, label_column) = (
        summary.sample_column.as_deref(),
        summary.label_column.as_deref(),
    );
    let report = match summary.sample_kind {
        ParquetSampleKind::Image => Some(inspect_samples(dataset, DEFAULT_MAX_PIXELS)?),
        ParquetSampleKind::Text | ParquetSampleKind::Numeric => None,
    };
    if args.json {
        let columns: Vec<serde_json::Value> = columns
            .iter()
            .map(|column| {
                let mut json = serde_json::json!({"name": column.name, "type": column.data_type});
                if let (Some(feature), Some(object)) = (&column.feature, json.as_object_mut()) {
                    object.insert("feature".into(), feature.clone().into());
                }
                json
            })
            .collect();
        let mut json = serde_json::json!({
            "format": format.names.0,
            "files": summary.files,
            "rows": summary.rows,
            "file_bytes": summary.file_bytes,
            "columns": columns,
            "sample_column": sample_column,
            "label_column": label_column,
            "images": report,
        });
        if let Some(object) = json.as_object_mut() {
            object.insert(format.chunks.0.into(), summary.chunks.into());
        }
        println!("{json}");
        return Ok(());
    }
    println!("dataset   {} ({})", args.data.display(), format.names.1);
    println!(
        "files     {} ({:.1} MB), {} {}, {} rows",
        summary.files,
        summary.file_bytes as f64 / 1e6,
        summary.chunks,
        format.chunks.1,
        summary.rows
    );
    println!("columns");
    for column in &columns {
        let role = if sample_column == Some(column.name) {
            match summary.sample_kind {
                ParquetSampleKind::Image => "  (images)",
                ParquetSampleKind::Text => "  (text)",
                ParquetSampleKind::Numeric => "",
            }
        } else if label_column == Some(column.name) {
            "  (labels)"
        } else {
            ""
        };
        match &column.feature {
            Some(feature) => println!(
                "  {:<24} {:<28} {feature}{role}",
                column.name, column.data_type
            ),
            None => println!("  {:<24} {}{role}", column.name, column.data_type),
        }
    }
    match report {
        Some(report) => print_report(&report),
        None => println!("samples   {}", summary.rows),
    }
    Ok(())
}

fn print_report(report: &DatasetReport) {
    println!("samples   {}", report.samples);
    println!("classes   {}", report.classes.len());
    for (name, count) in &report.classes {
        println!("  {name:<24} {count}");
    }
    println!("formats");
    for (name, count) in &report.formats {
        println!("  {name:<24} {count}");
    }
    let line = |what: &str, s: &stoker_datasets::Summary, unit: &str| {
        println!(
            "{what:<9} min {:.0}{unit}  median {:.0}{unit}  mean {:.0}{unit}  max {:.0}{unit}",
            s.min, s.p50, s.mean, s.max
        );
    };
    line("width", &report.width, " px");
    line("height", &report.height, " px");
    let kb = stoker_datasets::Summary {
        min: report.file_bytes.min / 1e3,
        mean: report.file_bytes.mean / 1e3,
        max: report.file_bytes.max / 1e3,
        p50: report.file_bytes.p50 / 1e3,
    };
    line("file", &kb, " KB");
    if report.pixels_over_limit > 0 {
        println!(
            "over the pixel limit ({DEFAULT_MAX_PIXELS}): {}",
            report.pixels_over_limit
        );
    }
    if !report.unreadable.is_empty() {
        let unreadable = report
            .formats
            .iter()
            .find(|(name, _)| name == "unreadable")
            .map_or(0, |(_, count)| *count);
        let shown = report.unreadable.len() as u64;
        let more = if unreadable > shown {
            format!(" (the first {shown} of {unreadable})")
        } else {
            String::new()
        };
        println!("unreadable{more}:");
        for name in &report.unreadable {
            println!("  {name}");
        }
    }
    if report.labels_outside_classes > 0 {
        println!(
            "labels outside the {} classes: {} (a job reads them as they are)",
            report.classes.len(),
            report.labels_outside_classes
        );
    }
}

fn inspect_tokens(args: &InspectArgs) -> anyhow::Result<()> {
    let dtype = match args.token_dtype.as_str() {
        "uint16" => TokenDtype::Uint16,
        "uint32" => TokenDtype::Uint32,
        _ => TokenDtype::from_file_name(&args.data),
    };
    let file = TokenFile::open(&args.data, dtype, args.seq_len)?;
    if args.token_dtype == "auto" {
        // Refused as a job refuses it.
        stoker_pipeline::token_dtype_fits(&file, &args.data.display().to_string())?;
    }
    let report = file.report()?;
    if args.json {
        println!("{}", serde_json::to_string(&report)?);
        return Ok(());
    }
    println!("dataset   {} (token file)", args.data.display());
    println!("tokens    {}", report.tokens);
    println!("dtype     {}", report.dtype.name());
    println!("bytes     {}", report.bytes);
    println!(
        "windows   {} of {} tokens (seq_len {} + 1)",
        report.windows,
        report.seq_len + 1,
        report.seq_len
    );
    println!("max id    {}", report.max_token);
    Ok(())
}

/// The op that cuts token sources into windows of `seq_len + 1` tokens.
fn token_windows(seq_len: u32) -> proto::Op {
    proto::Op {
        op: Some(proto::op::Op::TokenWindows(proto::TokenWindows {
            seq_len,
            ..Default::default()
        })),
    }
}

fn inspect_jsonl(args: &InspectArgs) -> anyhow::Result<()> {
    let documents = JsonlDocuments::open(&args.data, &args.text_field, "")?;
    print_jsonl(args, &args.data.display().to_string(), &documents)
}

/// The report of JSONL `documents`, named `name`.
fn print_jsonl(args: &InspectArgs, name: &str, documents: &JsonlDocuments) -> anyhow::Result<()> {
    let report = documents.report();
    if args.json {
        println!("{}", serde_json::to_string(&report)?);
        return Ok(());
    }
    println!("dataset   {name} (jsonl)");
    println!("files     {}", report.files);
    println!("documents {}", report.documents);
    println!("malformed {}", report.malformed);
    println!(
        "fields    text {:?}, label {}",
        report.text_field,
        report.label_field.as_deref().unwrap_or("none")
    );
    let s = &report.text_bytes;
    println!(
        "text      min {:.0} B  median {:.0} B  mean {:.0} B  max {:.0} B",
        s.min, s.p50, s.mean, s.max
    );
    Ok(())
}
