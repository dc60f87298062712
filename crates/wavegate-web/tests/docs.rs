//! The documentation stays true: the Grafana dashboard charts every metric and only metrics
//! that exist; the guide's actix-web example is the compiled `examples/embed.rs`.

use std::collections::BTreeSet;

#[test]
fn the_dashboard_charts_every_metric_and_nothing_else() {
    let text = include_str!("../../../docs/grafana-dashboard.json");
    let dashboard: serde_json::Value = serde_json::from_str(text).expect("valid JSON");
    let mut used = BTreeSet::new();
    for panel in dashboard["panels"].as_array().expect("panels") {
        for target in panel["targets"].as_array().expect("targets") {
            let expr = target["expr"].as_str().expect("expr");
            for token in expr.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_')) {
                if let Some(name) = token.strip_prefix("wavegate_").map(|_| token) {
                    let base = ["_bucket", "_count", "_sum"].iter().fold(name, |n, s| n.strip_suffix(s).unwrap_or(n));
                    used.insert(base.to_string());
                }
            }
        }
    }
    let known: BTreeSet<String> = wavegate::metrics::ALL.iter().map(|n| n.to_string()).collect();
    let unknown: Vec<_> = used.difference(&known).collect();
    let missing: Vec<_> = known.difference(&used).collect();
    assert!(unknown.is_empty(), "the dashboard uses metrics that do not exist: {unknown:?}");
    assert!(missing.is_empty(), "the dashboard does not chart: {missing:?}");
}

#[test]
fn the_guide_embedding_example_is_the_compiled_one() {
    let guide = include_str!("../../../docs/guide.md");
    let example = include_str!("../examples/embed.rs");
    let start = guide.find("```rust,ignore\n//! Embedding wavegate").expect("docs/guide.md shows examples/embed.rs");
    let body = &guide[start + "```rust,ignore\n".len()..];
    let shown = &body[..body.find("```").expect("closing fence")];
    assert_eq!(shown, example, "docs/guide.md's embedding example differs from crates/wavegate-web/examples/embed.rs");
}
