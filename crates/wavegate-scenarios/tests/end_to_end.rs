//! The runner end to end: the quick mode of one scenario with tiny numbers, real processes,
//! a real `redis-server` (started by the runner on a free port, never 6379).

use std::process::Command;

/// The strategies the runner must report (it prints the list it runs; these must be in it).
const EXPECTED: &[&str] = &["naive", "semaphore", "wavegate-seed", "wavegate-adaptive"];

#[test]
fn quick_hidden_capacity_reports_every_strategy_and_wavegate_loses_no_job() {
    let out = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("scenarios-end-to-end");
    let output = Command::new(env!("CARGO_BIN_EXE_wavegate-scenarios"))
        .args(["--quick", "--scenario", "hidden-capacity"])
        .args(["--jobs", "40", "--processes", "2", "--callers", "6", "--service-ms", "20-40"])
        .arg("--out")
        .arg(&out)
        .output()
        .expect("run the scenario runner");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "the runner failed\nstdout:\n{stdout}\nstderr:\n{stderr}");

    let listed: Vec<&str> = stdout
        .lines()
        .find_map(|l| l.strip_prefix("strategies: "))
        .expect("a `strategies:` line")
        .split(", ")
        .collect();
    for name in EXPECTED {
        assert!(listed.contains(name), "{name} is not run: {listed:?}");
    }
    for name in &listed {
        let row = stdout
            .lines()
            .find(|l| l.starts_with(&format!("| {name} |")))
            .unwrap_or_else(|| panic!("no table row for {name}:\n{stdout}"));
        let cells: Vec<&str> = row.split('|').map(str::trim).collect();
        assert_eq!(cells.len(), 11, "{row}");
        if name.starts_with("wavegate") {
            assert!(cells[2].starts_with("100.0 % (40/40)"), "{name} must not lose a job: {row}");
            assert_ne!(cells[9], "- (no Redis)", "{name} runs in shared mode: {row}");
        }
    }
    let svg = std::fs::read_to_string(out.join("scenario-hidden-capacity.svg")).expect("the picture");
    assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
    for name in &listed {
        assert!(svg.contains(&format!(">{name}</text>")), "{name} has no panel");
    }
}

#[test]
fn quick_openai_like_reports_the_bucket_table() {
    let out = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("scenarios-openai-like");
    let output = Command::new(env!("CARGO_BIN_EXE_wavegate-scenarios"))
        .args(["--quick", "--scenario", "openai-like", "--strategy", "oracle", "--strategy", "wavegate-adaptive"])
        .args(["--jobs", "30", "--processes", "2", "--callers", "5", "--service-ms", "20-40"])
        .arg("--out")
        .arg(&out)
        .output()
        .expect("run the scenario runner");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "the runner failed\nstdout:\n{stdout}\nstderr:\n{stderr}");
    for name in ["oracle", "wavegate-adaptive"] {
        // The bucket table's row: its cells, the provider's own measures included.
        let row = stdout
            .lines()
            .find(|l| l.starts_with(&format!("| {name} |")) && l.contains("k tokens"))
            .unwrap_or_else(|| panic!("no bucket row for {name}:\n{stdout}"));
        let cells: Vec<&str> = row.split('|').map(str::trim).collect();
        assert_eq!(cells[4], "0", "{name}: jobs failed in {row}");
        assert!(cells[5].starts_with("0 of "), "{name}: 429s in {row}");
        assert!(cells[10].ends_with(" s"), "{name}: the provider's silence is measured: {row}");
        assert!(cells[12].ends_with('%'), "{name}: the charged tokens are read: {row}");
    }
}

/// Runs the quick mode of `scenario` with oracle and wavegate-adaptive on 2 processes ×
/// `callers` and `jobs` jobs of 300-600 ms: each strategy's row of the bucket table, as cells.
fn bucket_rows(scenario: &str, jobs: &str, callers: &str) -> Vec<(String, Vec<String>)> {
    let out = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("scenarios-{scenario}"));
    let output = Command::new(env!("CARGO_BIN_EXE_wavegate-scenarios"))
        .args(["--quick", "--scenario", scenario, "--strategy", "oracle", "--strategy", "wavegate-adaptive"])
        .args(["--jobs", jobs, "--processes", "2", "--callers", callers, "--service-ms", "300-600"])
        .arg("--out")
        .arg(&out)
        .output()
        .expect("run the scenario runner");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "the runner failed\nstdout:\n{stdout}\nstderr:\n{stderr}");
    ["oracle", "wavegate-adaptive"]
        .iter()
        .map(|name| {
            let row = stdout
                .lines()
                .find(|l| l.starts_with(&format!("| {name} |")) && l.contains("k tokens"))
                .unwrap_or_else(|| panic!("no bucket row for {name}:\n{stdout}"));
            (row.to_string(), row.split('|').map(|c| c.trim().to_string()).collect())
        })
        .collect()
}

/// Streamed answers: every job served; 50 callers against the fleet's limit of 32 and the
/// provider's hidden cap of 48, and the provider never had more than 32 streams open at once
/// nor refused one for its cap (a stream that held nothing while it ran would reach the cap);
/// each wavegate stream settled from its final usage.
#[test]
fn quick_openai_like_stream_holds_streams_and_settles_their_usage() {
    for (row, cells) in bucket_rows("openai-like-stream", "100", "25") {
        assert_eq!(cells[4], "0", "jobs failed in {row}");
        let most_open: usize = cells[9].parse().unwrap_or_else(|_| panic!("most open at once in {row}"));
        assert!((1..=32).contains(&most_open), "{row}");
        assert!(cells[5].ends_with(" / 0"), "no 429 for the cap: {row}");
        assert_eq!(cells[14], "0", "streams cut in {row}");
        if cells[1] == "wavegate-adaptive" {
            assert_eq!(cells[13], "100 / 0", "every stream settled from its final usage: {row}");
        }
    }
}

/// Anthropic's input and output limits apart: the large calls (10,000 in / 2,000 out, above
/// the 8,000 output tokens a minute together) are served, none refused, and at once: the 12
/// jobs fit in the provider's starting buckets (a fleet that learned the output limit alone
/// holds a 12,000-token estimate back for most of a minute).
#[test]
fn quick_anthropic_like_serves_the_large_calls() {
    for (row, cells) in bucket_rows("anthropic-like", "12", "5") {
        assert_eq!(cells[4], "0", "jobs failed in {row}");
        assert!(cells[14].starts_with("2 / 0 ("), "both large calls served: {row}");
        let longest: f64 = cells[14]
            .trim_start_matches("2 / 0 (")
            .trim_end_matches(" s)")
            .parse()
            .unwrap_or_else(|_| panic!("the longest large call in {row}"));
        assert!(longest < 10.0, "a large call waited {longest} s with room in both buckets: {row}");
        assert!(cells[13].ends_with('%'), "the output charged is read: {row}");
    }
}
