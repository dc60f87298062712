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
        assert!(cells[9].ends_with(" s"), "{name}: the provider's silence is measured: {row}");
        assert!(cells[11].ends_with('%'), "{name}: the charged tokens are read: {row}");
    }
}
