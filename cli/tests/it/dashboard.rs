//! The dashboard as a user sees it: `stoker demo --dashboard` serving the page, the JSON API and
//! `/metrics`; the page rendered by headless Chromium shows the API's figures; `/metrics` is
//! valid Prometheus text. Also the library's `Dashboard` on its own: port 0, stop on drop.
//!
//! Chromium is `STOKER_CHROMIUM` when set (`./dev test` sets it to the one it finds or installs),
//! else Debian's `chromium` package at `/usr/bin/chromium`. The screenshot lands in
//! `target/test-output/dashboard/dashboard.png`.

#![allow(clippy::unwrap_used)] // tests fail loudly by design

use std::collections::{HashMap, HashSet};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use serde_json::Value;
use stoker_loader::{Dashboard, DashboardError, Loader, LoaderOptions};

use crate::common;

const CHROMIUM: &str = "/usr/bin/chromium";

// ---------------------------------------------------------------------------------------------
// A minimal HTTP/1.1 client over std TcpStream.

pub(crate) struct Response {
    pub(crate) status: u16,
    /// Header names in lower case.
    pub(crate) headers: HashMap<String, String>,
    pub(crate) body: String,
}

fn http_get(address: SocketAddr, path: &str) -> Response {
    http_get_with(address, path, &[])
}

/// `GET path` with extra request headers.
pub(crate) fn http_get_with(
    address: SocketAddr,
    path: &str,
    extra_headers: &[(&str, &str)],
) -> Response {
    let mut stream = TcpStream::connect_timeout(&address, Duration::from_secs(5)).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    get_over(&mut stream, &address.to_string(), path, extra_headers)
}

/// `GET path` over `stream` (plain TCP or TLS), reading the answer to the end.
pub(crate) fn get_over(
    stream: &mut (impl Read + Write),
    host: &str,
    path: &str,
    extra_headers: &[(&str, &str)],
) -> Response {
    let extra: String = extra_headers
        .iter()
        .map(|(name, value)| format!("{name}: {value}\r\n"))
        .collect();
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: {host}\r\n{extra}Connection: close\r\n\r\n"
    )
    .unwrap();
    stream.flush().unwrap();
    let mut raw = Vec::new();
    let mut chunk = [0u8; 16 << 10];
    loop {
        match stream.read(&mut chunk) {
            Ok(0) => break,
            Ok(n) => raw.extend_from_slice(&chunk[..n]),
            // A TLS peer that closes without close_notify: the answer is whole by then.
            Err(error) if error.kind() == std::io::ErrorKind::UnexpectedEof => break,
            Err(error) => panic!("reading {path}: {error}"),
        }
    }
    let split = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .expect("end of headers");
    let head = String::from_utf8(raw[..split].to_vec()).unwrap();
    let mut lines = head.split("\r\n");
    let status_line = lines.next().unwrap();
    assert!(status_line.starts_with("HTTP/1.1 "), "{status_line}");
    let status = status_line[9..12].parse().unwrap();
    let headers: HashMap<String, String> = lines
        .map(|line| {
            let (name, value) = line.split_once(':').unwrap();
            (name.trim().to_ascii_lowercase(), value.trim().to_string())
        })
        .collect();
    let mut body = raw[split + 4..].to_vec();
    if headers.get("transfer-encoding").map(String::as_str) == Some("chunked") {
        body = dechunk(&body);
    } else if let Some(length) = headers.get("content-length") {
        assert_eq!(
            body.len(),
            length.parse::<usize>().unwrap(),
            "{path}: body length"
        );
    }
    Response {
        status,
        headers,
        body: String::from_utf8(body).unwrap(),
    }
}

fn dechunk(mut data: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    loop {
        let line_end = data.windows(2).position(|w| w == b"\r\n").unwrap();
        let size_text = std::str::from_utf8(&data[..line_end]).unwrap();
        let size = usize::from_str_radix(size_text.split(';').next().unwrap().trim(), 16).unwrap();
        data = &data[line_end + 2..];
        if size == 0 {
            return out;
        }
        out.extend_from_slice(&data[..size]);
        data = &data[size + 2..];
    }
}

pub(crate) fn get_json(address: SocketAddr, path: &str) -> Value {
    let response = http_get(address, path);
    assert_eq!(response.status, 200, "{path}: {}", response.body);
    assert!(
        response.headers["content-type"].starts_with("application/json"),
        "{path}: {:?}",
        response.headers
    );
    serde_json::from_str(&response.body).unwrap()
}

// ---------------------------------------------------------------------------------------------
// Child processes that are always reaped.

/// The demo process; killed and reaped when dropped, whatever the test's outcome.
struct Demo {
    child: Child,
    lines: mpsc::Receiver<String>,
}

impl Demo {
    fn start(tmp: &Path) -> Self {
        let mut child = Command::new(env!("CARGO_BIN_EXE_stoker"))
            .args([
                "demo",
                "--dashboard",
                "127.0.0.1:0",
                "--seconds",
                "8",
                "--linger",
                "20",
                "--sample-images",
                "64",
                "--batch-size",
                "16",
            ])
            .env("TMPDIR", tmp)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let (sender, lines) = mpsc::channel();
        // Drains stdout for the whole run so the demo never blocks on a full pipe.
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                println!("demo: {line}");
                if sender.send(line).is_err() {
                    break;
                }
            }
        });
        Self { child, lines }
    }

    /// The address in the `dashboard: http://ADDR/` line.
    fn dashboard_address(&self) -> SocketAddr {
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let line = self
                .lines
                .recv_timeout(left)
                .expect("the demo prints `dashboard: http://ADDR/`");
            if let Some(url) = line.strip_prefix("dashboard: http://") {
                let address = url.trim_end_matches('/').parse().unwrap();
                return address;
            }
        }
    }

    fn assert_running(&mut self) {
        assert!(
            self.child.try_wait().unwrap().is_none(),
            "the demo exited early"
        );
    }
}

impl Drop for Demo {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Runs a command, killing it if it outlives `limit`.
pub(crate) fn run_with_limit(command: &mut Command, limit: Duration) -> Output {
    let mut child = command
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdout = child.stdout.take().unwrap();
    let mut stderr = child.stderr.take().unwrap();
    let out = std::thread::spawn(move || {
        let mut buffer = Vec::new();
        stdout.read_to_end(&mut buffer).map(|_| buffer)
    });
    let err = std::thread::spawn(move || {
        let mut buffer = Vec::new();
        stderr.read_to_end(&mut buffer).map(|_| buffer)
    });
    let deadline = Instant::now() + limit;
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{command:?} ran past {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    Output {
        status,
        stdout: out.join().unwrap().unwrap(),
        stderr: err.join().unwrap().unwrap(),
    }
}

// ---------------------------------------------------------------------------------------------
// Headless Chromium.

fn chromium() -> String {
    let chromium = std::env::var("STOKER_CHROMIUM").unwrap_or_else(|_| CHROMIUM.to_string());
    assert!(
        Path::new(&chromium).exists(),
        "{chromium} is missing: the dashboard test renders the page in Chromium. Run \
         `./dev test`, which finds or installs it (or `apt-get install chromium`, or set \
         STOKER_CHROMIUM to its binary)."
    );
    chromium
}

/// Chromium with a fresh profile, no network beyond the URL it is given, and virtual time so
/// the page's 1 s polls run without the test waiting for them.
pub(crate) fn headless(profile: &Path) -> Command {
    let mut command = Command::new(chromium());
    command
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--disable-dev-shm-usage",
            "--hide-scrollbars",
            "--virtual-time-budget=3000",
        ])
        .arg(format!("--user-data-dir={}", profile.display()))
        .env("HOME", profile);
    command
}

fn output_dir() -> PathBuf {
    // The binary is target/<profile>/stoker, so this is target/test-output/dashboard.
    let target = Path::new(env!("CARGO_BIN_EXE_stoker"))
        .parent()
        .and_then(Path::parent)
        .unwrap();
    let dir = target.join("test-output").join("dashboard");
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

// ---------------------------------------------------------------------------------------------
// Reading the rendered DOM.

/// The opening tag of the element with `id`.
fn tag_with_id<'a>(dom: &'a str, id: &str) -> &'a str {
    let needle = format!("id=\"{id}\"");
    let at = dom
        .find(&needle)
        .unwrap_or_else(|| panic!("no element #{id} in the page"));
    let start = dom[..at].rfind('<').unwrap();
    let end = at + dom[at..].find('>').unwrap();
    &dom[start..=end]
}

/// The text of the element with `id` (a leaf element), entities decoded.
pub(crate) fn text_of(dom: &str, id: &str) -> String {
    let tag = tag_with_id(dom, id);
    let start = dom.find(tag).unwrap() + tag.len();
    let end = start + dom[start..].find('<').unwrap();
    dom[start..end]
        .replace("&lt;", "<")
        .replace("&gt;", ">")
        .replace("&quot;", "\"")
        .replace("&nbsp;", "\u{a0}")
        .replace("&amp;", "&")
}

fn attribute_of(dom: &str, id: &str, name: &str) -> String {
    let tag = tag_with_id(dom, id);
    let needle = format!("{name}=\"");
    let start = tag
        .find(&needle)
        .unwrap_or_else(|| panic!("#{id} has no {name}"))
        + needle.len();
    let end = start + tag[start..].find('"').unwrap();
    tag[start..end].to_string()
}

/// What the page prints for an API number: JavaScript's `toFixed`, a dash for null. The API
/// rounds its figures to these places already, so there are no halfway cases where Rust's and
/// JavaScript's rounding could differ.
fn shown(value: &Value, digits: usize) -> String {
    match value.as_f64() {
        Some(number) => format!("{number:.digits$}"),
        None => "\u{2013}".to_string(),
    }
}

// ---------------------------------------------------------------------------------------------
// A strict reader of the Prometheus text format (0.0.4).

#[derive(Debug)]
struct PromSample {
    name: String,
    labels: Labels,
    value: f64,
}

fn valid_metric_name(name: &str) -> bool {
    let mut chars = name.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_alphabetic() || c == '_' || c == ':')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
}

fn valid_label_name(name: &str) -> bool {
    let mut chars = name.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
        && !name.starts_with("__")
}

fn parse_value(text: &str) -> Result<f64, String> {
    match text {
        "NaN" => return Ok(f64::NAN),
        "+Inf" => return Ok(f64::INFINITY),
        "-Inf" => return Ok(f64::NEG_INFINITY),
        _ => {}
    }
    // Rust also accepts "inf", "nan" and "infinity"; the format does not.
    let plain = text
        .chars()
        .all(|c| c.is_ascii_digit() || matches!(c, '.' | 'e' | 'E' | '+' | '-'));
    if !plain || !text.chars().any(|c| c.is_ascii_digit()) {
        return Err(format!("bad value {text:?}"));
    }
    text.parse().map_err(|_| format!("bad value {text:?}"))
}

/// Label names and values, in order.
type Labels = Vec<(String, String)>;

/// Parses `{a="x",b="y"}` at the start of `text`; returns the labels and the rest.
fn parse_labels(text: &str) -> Result<(Labels, &str), String> {
    let mut rest = text.strip_prefix('{').ok_or("expected {")?;
    let mut labels = Vec::new();
    loop {
        if let Some(after) = rest.strip_prefix('}') {
            return Ok((labels, after));
        }
        let eq = rest.find('=').ok_or("label without =")?;
        let name = &rest[..eq];
        if !valid_label_name(name) {
            return Err(format!("bad label name {name:?}"));
        }
        rest = rest[eq + 1..]
            .strip_prefix('"')
            .ok_or("label value not quoted")?;
        let mut value = String::new();
        let mut chars = rest.char_indices();
        let close = loop {
            match chars.next() {
                Some((_, '\\')) => match chars.next() {
                    Some((_, '\\')) => value.push('\\'),
                    Some((_, '"')) => value.push('"'),
                    Some((_, 'n')) => value.push('\n'),
                    other => return Err(format!("bad escape {other:?}")),
                },
                Some((at, '"')) => break at,
                Some((_, '\n')) | None => return Err("unterminated label value".into()),
                Some((_, c)) => value.push(c),
            }
        };
        if labels.iter().any(|(n, _)| n == name) {
            return Err(format!("label {name} twice"));
        }
        labels.push((name.to_string(), value));
        rest = &rest[close + 1..];
        if let Some(after) = rest.strip_prefix(',') {
            rest = after;
        } else if !rest.starts_with('}') {
            return Err("expected , or }".into());
        }
    }
}

/// The family a sample belongs to, given the TYPE lines seen: its own name, or for histograms
/// and summaries the name less `_bucket`, `_sum` or `_count`.
fn family_of<'a>(name: &'a str, types: &HashMap<String, String>) -> Option<&'a str> {
    if types.contains_key(name) {
        return Some(name);
    }
    for suffix in ["_bucket", "_sum", "_count"] {
        if let Some(base) = name.strip_suffix(suffix) {
            match types.get(base).map(String::as_str) {
                Some("histogram") => return Some(base),
                Some("summary") if suffix != "_bucket" => return Some(base),
                _ => {}
            }
        }
    }
    None
}

fn parse_prometheus(text: &str) -> Result<Vec<PromSample>, String> {
    if !text.ends_with('\n') {
        return Err("the exposition must end with a newline".into());
    }
    let mut types: HashMap<String, String> = HashMap::new();
    let mut helps: HashSet<String> = HashSet::new();
    let mut finished_families: HashSet<String> = HashSet::new();
    let mut current_family: Option<String> = None;
    let mut series: HashSet<String> = HashSet::new();
    let mut samples = Vec::new();
    for (number, line) in text.lines().enumerate() {
        let at = |message: String| format!("line {}: {message}: {line:?}", number + 1);
        if line.is_empty() {
            continue;
        }
        if let Some(comment) = line.strip_prefix('#') {
            let mut words = comment.trim_start().splitn(3, ' ');
            let keyword = words.next().unwrap_or_default();
            if keyword != "HELP" && keyword != "TYPE" {
                continue; // a plain comment
            }
            let name = words.next().ok_or_else(|| at("no metric name".into()))?;
            if !valid_metric_name(name) {
                return Err(at(format!("bad metric name {name:?}")));
            }
            let rest = words.next().unwrap_or_default();
            if keyword == "HELP" {
                if !helps.insert(name.to_string()) {
                    return Err(at("second HELP".into()));
                }
                let mut chars = rest.chars();
                while let Some(c) = chars.next() {
                    if c == '\\' && !matches!(chars.next(), Some('\\' | 'n')) {
                        return Err(at("bad escape in HELP".into()));
                    }
                }
            } else {
                if !matches!(
                    rest,
                    "counter" | "gauge" | "histogram" | "summary" | "untyped"
                ) {
                    return Err(at(format!("bad type {rest:?}")));
                }
                if types.contains_key(name) {
                    return Err(at("second TYPE".into()));
                }
                if finished_families.contains(name) || current_family.as_deref() == Some(name) {
                    return Err(at("TYPE after the family's samples".into()));
                }
                types.insert(name.to_string(), rest.to_string());
            }
            continue;
        }
        let name_end = line.find(['{', ' ']).ok_or_else(|| at("no value".into()))?;
        let name = &line[..name_end];
        if !valid_metric_name(name) {
            return Err(at(format!("bad metric name {name:?}")));
        }
        let (labels, rest) = if line[name_end..].starts_with('{') {
            parse_labels(&line[name_end..]).map_err(at)?
        } else {
            (Vec::new(), &line[name_end..])
        };
        let rest = rest
            .strip_prefix(' ')
            .ok_or_else(|| at("expected a space before the value".into()))?;
        let mut fields = rest.split(' ');
        let value = parse_value(fields.next().unwrap_or_default()).map_err(at)?;
        if let Some(timestamp) = fields.next() {
            timestamp
                .parse::<i64>()
                .map_err(|_| at(format!("bad timestamp {timestamp:?}")))?;
        }
        if fields.next().is_some() {
            return Err(at("trailing fields".into()));
        }
        let family = family_of(name, &types)
            .ok_or_else(|| at(format!("no TYPE line before the samples of {name}")))?
            .to_string();
        if current_family.as_deref() != Some(family.as_str()) {
            if finished_families.contains(&family) {
                return Err(at(format!("samples of {family} are not together")));
            }
            if let Some(previous) = current_family.replace(family.clone()) {
                finished_families.insert(previous);
            }
        }
        if types[&family] == "counter" && (value.is_nan() || value < 0.0) {
            return Err(at("negative or NaN counter".into()));
        }
        let mut key_labels = labels.clone();
        key_labels.sort();
        if !series.insert(format!("{name}{key_labels:?}")) {
            return Err(at("duplicate series".into()));
        }
        samples.push(PromSample {
            name: name.to_string(),
            labels,
            value,
        });
    }
    Ok(samples)
}

fn metric(samples: &[PromSample], name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    samples
        .iter()
        .find(|s| {
            s.name == name
                && labels
                    .iter()
                    .all(|(k, v)| s.labels.iter().any(|(lk, lv)| lk == k && lv == v))
        })
        .map(|s| s.value)
}

#[test]
fn prometheus_reader_is_strict() {
    let good = "# HELP a_total A.\n# TYPE a_total counter\na_total{job=\"x\",rank=\"0\"} 3\n\
                # TYPE h histogram\nh_bucket{le=\"+Inf\"} 1\nh_sum 2.5\nh_count 1\n";
    assert_eq!(parse_prometheus(good).unwrap().len(), 4);
    for bad in [
        "a 1\n",                                           // no TYPE
        "# TYPE a gauge\na inf\n",                         // Rust's spelling of infinity
        "# TYPE a gauge\na{b=\"1} 1\n",                    // unterminated label
        "# TYPE a gauge\na{1b=\"1\"} 1\n",                 // bad label name
        "# TYPE a gauge\na 1\n# TYPE b gauge\nb 1\na 2\n", // family split
        "# TYPE a gauge\na 1\na 2\n",                      // duplicate series
        "# TYPE a counter\na -1\n",                        // negative counter
        "# TYPE a gauge\na 1",                             // no final newline
        "# TYPE 1a gauge\n",                               // bad name
    ] {
        assert!(parse_prometheus(bad).is_err(), "accepted {bad:?}");
    }
}

// ---------------------------------------------------------------------------------------------
// The tests.

/// Waits until the demo's job has a verdict over five seconds of readings (more than the two a
/// verdict needs, so the screenshot shows some history), returning the API body.
fn wait_for_data(address: SocketAddr) -> Value {
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        let body = get_json(address, "/api/jobs");
        let ready = body["jobs"]
            .as_array()
            .and_then(|jobs| jobs.first())
            .is_some_and(|job| {
                job["verdict"] != "starting"
                    && job["current"]["samples_total"].as_u64() > Some(0)
                    && job["window"]["seconds"].as_f64() >= Some(5.0)
            });
        if ready {
            return body;
        }
        assert!(
            Instant::now() < deadline,
            "no dashboard data in time: {body}"
        );
        std::thread::sleep(Duration::from_millis(250));
    }
}

#[test]
fn demo_dashboard_page_matches_api_and_metrics_parse() {
    let tmp = tempfile::tempdir().unwrap();
    let mut demo = Demo::start(tmp.path());
    let address = demo.dashboard_address();
    println!("dashboard at http://{address}/");

    let page = http_get(address, "/");
    assert_eq!(page.status, 200);
    assert!(page.headers["content-type"].starts_with("text/html"));
    assert!(page.body.contains("<title>Stoker dashboard</title>"));
    // Everything the page loads comes from this server: no CDN, no other host.
    assert!(!page.body.contains("http://") && !page.body.contains("https://"));
    let script = http_get(address, "/dashboard.js");
    assert_eq!(script.status, 200);
    assert!(
        !script.body.contains("http"),
        "the script fetches only relative URLs"
    );
    assert_eq!(http_get(address, "/no-such-page").status, 404);

    let api = wait_for_data(address);
    let job = &api["jobs"][0];
    assert_eq!(job["name"], "demo");
    assert_eq!(job["rank"], 0);
    let key = job["key"].as_str().unwrap().to_string();
    assert_eq!(key, "demo-0");
    assert!(job["series"].as_array().unwrap().len() >= 4, "{job}");
    assert!(job["threads"].as_u64().unwrap() >= 1);
    let verdict = job["verdict"].as_str().unwrap();
    assert!(
        ["compute-bound", "balanced", "idle"].contains(&verdict)
            || verdict.starts_with("input-bound: "),
        "{verdict}"
    );
    assert_eq!(job["workers"].as_array().unwrap().len(), 1);

    // /metrics: strict text format, with the stall figures for the demo job.
    let metrics = http_get(address, "/metrics");
    assert_eq!(metrics.status, 200);
    assert!(
        metrics.headers["content-type"].starts_with("text/plain; version=0.0.4"),
        "{:?}",
        metrics.headers
    );
    let samples = parse_prometheus(&metrics.body)
        .unwrap_or_else(|e| panic!("{e}\n--- /metrics ---\n{}", metrics.body));
    let labels = [("stoker_job", "demo"), ("rank", "0")];
    // Nothing measured the GPU: the idle ratio is left out, the counters are 0.
    assert!(!metrics.body.contains("\nstoker_gpu_idle_ratio{"));
    assert!(metrics
        .body
        .contains("# TYPE stoker_gpu_idle_seconds_total counter"));
    // Nor what a GPU decode lane beside the step costs: the counter is there, at 0.
    assert!(metrics
        .body
        .contains("# TYPE stoker_gpu_lane_cost_seconds_total counter"));
    assert_eq!(
        metric(&samples, "stoker_gpu_lane_cost_seconds_total", &labels),
        Some(0.0)
    );
    for name in ["stoker_stall_ratio", "stoker_stall_ratio_window"] {
        let ratio = metric(&samples, name, &labels).unwrap_or_else(|| panic!("{name} missing"));
        assert!((0.0..=1.0).contains(&ratio), "{name} = {ratio}");
    }
    let waited = metric(&samples, "stoker_wait_seconds_total", &labels).unwrap();
    let ran = metric(&samples, "stoker_run_seconds_total", &labels).unwrap();
    assert!(
        waited >= 0.0 && ran > 0.0 && waited <= ran,
        "wait {waited} of {ran}"
    );
    assert!(metric(&samples, "stoker_samples_total", &labels).unwrap() > 0.0);
    for stage in ["read", "decode", "augment", "assemble"] {
        let mut with_stage = labels.to_vec();
        with_stage.push(("stage", stage));
        assert!(metric(&samples, "stoker_stage_seconds_total", &with_stage).is_some());
    }
    for name in [
        "stoker_samples_per_second",
        "stoker_prefetch_depth",
        "stoker_in_flight_batches",
        "stoker_bad_samples_total",
        "stoker_decode_busy_ratio",
    ] {
        assert!(metric(&samples, name, &labels).is_some(), "{name} missing");
    }
    assert!(metrics.body.contains("# TYPE stoker_samples_total counter"));
    assert!(metrics.body.contains("# TYPE stoker_stall_ratio gauge"));

    // The page in headless Chromium: a screenshot, then the rendered DOM.
    let out_dir = output_dir();
    let screenshot = out_dir.join("dashboard.png");
    let _ = std::fs::remove_file(&screenshot);
    let profile = tempfile::tempdir().unwrap();
    let shot = run_with_limit(
        headless(profile.path())
            .arg(format!("--screenshot={}", screenshot.display()))
            .arg("--window-size=1280,900")
            .arg(format!("http://{address}/")),
        Duration::from_secs(90),
    );
    assert!(
        shot.status.success(),
        "chromium --screenshot failed: {}",
        String::from_utf8_lossy(&shot.stderr)
    );
    let png = std::fs::read(&screenshot).unwrap();
    assert!(png.starts_with(b"\x89PNG\r\n\x1a\n") && png.len() > 10_000);
    println!("screenshot: {}", screenshot.display());

    let before = get_json(address, "/api/jobs");
    let profile = tempfile::tempdir().unwrap();
    let dump = run_with_limit(
        headless(profile.path())
            .arg("--dump-dom")
            .arg(format!("http://{address}/")),
        Duration::from_secs(90),
    );
    let after = get_json(address, "/api/jobs");
    assert!(
        dump.status.success(),
        "chromium --dump-dom failed: {}",
        String::from_utf8_lossy(&dump.stderr)
    );
    let dom = String::from_utf8(dump.stdout).unwrap();
    std::fs::write(out_dir.join("dashboard.html"), &dom).unwrap();
    demo.assert_running();

    // The page refreshes every second and the sampler reads every 500 ms, so figures fetched
    // "at about the same time" can differ by a reading. Instead of a tolerance, the page stamps
    // the reading it shows (data-t-ms) and the API returns that same reading with ?at=, so the
    // comparison is exact; the stamp must lie between the API fetches around the page's
    // lifetime, which proves the page showed live figures.
    let id = |field: &str| format!("job-{key}-{field}");
    let t_ms: u64 = attribute_of(&dom, &id("t"), "data-t-ms").parse().unwrap();
    let earliest = before["jobs"][0]["current"]["t_ms"].as_u64().unwrap();
    let latest = after["now_ms"].as_u64().unwrap();
    assert!(
        (earliest..=latest).contains(&t_ms),
        "the page shows the reading of {t_ms}, not one between {earliest} and {latest}"
    );
    let at = get_json(address, &format!("/api/jobs?at={t_ms}"));
    let job = &at["jobs"][0];
    let current = &job["current"];
    let window = &job["window"];
    assert_eq!(current["t_ms"].as_u64(), Some(t_ms));
    let expected = [
        ("verdict", job["verdict"].as_str().unwrap().to_string()),
        ("stall", shown(&current["stall_pct"], 1)),
        // No GPU measures the demo: the figure says so ("–"), it shows no zero.
        ("gpu-idle", shown(&current["gpu_idle_pct"], 1)),
        ("throughput", shown(&current["samples_per_s"], 1)),
        (
            "queue",
            format!("{} / {}", current["in_flight"], current["prefetch_depth"]),
        ),
        ("latency", shown(&current["batch_latency_ms"], 2)),
        ("busy", shown(&current["busy_pct"], 1)),
        ("bad", current["bad_samples"].to_string()),
        ("window-stall", shown(&window["stall_pct"], 1)),
        ("window-gpu-idle", shown(&window["gpu_idle_pct"], 1)),
        ("window-lane-cost", shown(&window["gpu_lane_cost_pct"], 1)),
        ("window-seconds", shown(&window["seconds"], 1)),
        ("window-throughput", shown(&window["samples_per_s"], 1)),
    ];
    for (field, want) in expected {
        let got = text_of(&dom, &id(field));
        println!("#{}: page {got:?}, api {want:?}", id(field));
        assert_eq!(got, want, "#{} differs from /api/jobs?at={t_ms}", id(field));
    }
    for chart in ["stall", "throughput", "queue", "time"] {
        tag_with_id(&dom, &id(&format!("chart-{chart}")));
    }
    assert!(
        dom.contains("decode threads (this process)"),
        "the worker table"
    );
}

#[test]
fn dashboard_binds_port_zero_charts_a_loader_and_stops_on_drop() {
    let data = tempfile::tempdir().unwrap();
    common::make_images(data.path(), 24);
    let loader = Loader::new(common::train_spec(data.path(), 8), LoaderOptions::default()).unwrap();
    let dashboard = Dashboard::start("127.0.0.1:0".parse().unwrap()).unwrap();
    let address = dashboard.local_addr();
    assert_ne!(address.port(), 0);
    assert_eq!(dashboard.url(), format!("http://{address}/"));

    let empty = get_json(address, "/api/jobs");
    assert_eq!(empty["jobs"].as_array().unwrap().len(), 0);
    // Another host's name (a web page's domain rebound to 127.0.0.1): refused; localhost is not.
    for (host, status) in [
        ("evil.example:80", 403),
        (&*format!("localhost:{}", address.port()), 200),
    ] {
        let mut stream = TcpStream::connect_timeout(&address, Duration::from_secs(5)).unwrap();
        stream
            .set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        let answer = get_over(&mut stream, host, "/api/jobs", &[]);
        assert_eq!(answer.status, status, "{host}: {}", answer.body);
    }
    let metrics = http_get(address, "/metrics");
    assert!(parse_prometheus(&metrics.body).unwrap().is_empty());

    dashboard.register_job("train \"a\"", 3, loader.monitor());
    let mut stream = loader.epoch(0, 0).unwrap();
    while stream.next_batch().unwrap().is_some() {}
    std::thread::sleep(Duration::from_millis(1200));
    let body = get_json(address, "/api/jobs");
    let job = &body["jobs"][0];
    assert_eq!(job["name"], "train \"a\"");
    assert_eq!(job["rank"], 3);
    assert_eq!(job["key"], "train__a_-3");
    assert_eq!(job["current"]["samples_total"], 24);
    let metrics = http_get(address, "/metrics");
    let samples = parse_prometheus(&metrics.body).unwrap();
    let labels = [("stoker_job", "train \"a\""), ("rank", "3")];
    assert_eq!(
        metric(&samples, "stoker_samples_total", &labels),
        Some(24.0)
    );

    // A second registration under the same name and rank replaces the first.
    dashboard.register_job("train \"a\"", 3, loader.monitor());
    assert_eq!(
        get_json(address, "/api/jobs")["jobs"]
            .as_array()
            .unwrap()
            .len(),
        1
    );

    let taken = Dashboard::start(address).unwrap_err();
    assert!(taken.to_string().contains("cannot listen"), "{taken}");

    // Off loopback, an embedded dashboard without a credential does not start, and says why.
    let off_loopback: SocketAddr = "0.0.0.0:0".parse().unwrap();
    let refused = Dashboard::start(off_loopback).unwrap_err();
    assert!(
        matches!(refused, DashboardError::NeedsCredential(at) if at == off_loopback),
        "{refused}"
    );
    assert!(
        refused.to_string().contains("needs a dashboard credential"),
        "{refused}"
    );

    drop(dashboard);
    assert!(
        TcpStream::connect_timeout(&address, Duration::from_secs(1)).is_err(),
        "still listening after drop"
    );
}
