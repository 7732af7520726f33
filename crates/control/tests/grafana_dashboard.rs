//! The Grafana dashboard in contrib/grafana/natrix.json queries only what
//! natrix exports: every `expr` is parsed as PromQL (promql-parser, after
//! Grafana's variables are given values), and each selector's metric name,
//! label names and label values are looked up in the exposition that
//! `metrics::render` produces. Range functions are only applied to
//! counters, grouping labels and legend labels exist on the series they
//! group, and the dashboard covers what operators need to see.

use std::collections::{BTreeMap, BTreeSet};

use natrix_control::metrics::{render, Format};
use natrix_dataplane::{IoSnapshot, WorkerSnapshot};
use natrix_engine::DropReason;
use promql_parser::label::MatchOp;
use promql_parser::parser::{self, Expr, VectorSelector};
use serde_json::Value;

/// Labels Prometheus adds to every scraped series.
const TARGET_LABELS: [&str; 2] = ["job", "instance"];

/// Sample name -> (type, label name -> values seen).
struct Exposition {
    families: BTreeMap<String, (String, BTreeMap<String, BTreeSet<String>>)>,
}

impl Exposition {
    fn natrix() -> Exposition {
        let mut w = WorkerSnapshot::default();
        w.stats.drops.count(DropReason::PoolExhausted);
        let text = render(&[w.clone(), w], &IoSnapshot::default(), (1, 1), None, Format::Prometheus);
        let mut families = BTreeMap::new();
        let mut kind = String::new();
        for line in text.lines() {
            if let Some(rest) = line.strip_prefix("# TYPE ") {
                kind = rest.split(' ').nth(1).unwrap().to_owned();
                continue;
            }
            if line.starts_with('#') {
                continue;
            }
            let series = line.rsplit_once(' ').unwrap().0;
            let (name, labels) = series.split_once('{').map(|(n, l)| (n, l.trim_end_matches('}'))).unwrap_or((series, ""));
            let (_, seen) = families.entry(name.to_owned()).or_insert_with(|| (kind.clone(), BTreeMap::new()));
            for pair in labels.split(',').filter(|p| !p.is_empty()) {
                let (k, v) = pair.split_once('=').unwrap();
                seen.entry(k.to_owned()).or_insert_with(BTreeSet::new).insert(v.trim_matches('"').to_owned());
            }
        }
        Exposition { families }
    }
}

fn dashboard() -> Value {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../contrib/grafana/natrix.json");
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{path}: {e}"));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{path}: not JSON: {e}"))
}

/// (panel title, expr, legendFormat) of every query target.
fn targets(v: &Value, title: &str, out: &mut Vec<(String, String, String)>) {
    match v {
        Value::Object(m) => {
            let title = m.get("title").and_then(Value::as_str).unwrap_or(title);
            if let Some(expr) = m.get("expr").and_then(Value::as_str) {
                out.push((title.to_owned(), expr.to_owned(), m.get("legendFormat").and_then(Value::as_str).unwrap_or("").to_owned()));
            }
            for child in m.values() {
                targets(child, title, out);
            }
        }
        Value::Array(a) => a.iter().for_each(|c| targets(c, title, out)),
        _ => {}
    }
}

/// Grafana's variables given values a query can be parsed with.
fn substitute(expr: &str) -> String {
    expr.replace("$__rate_interval", "5m").replace("$__interval", "1m").replace("$__range", "1h").replace("${instance}", ".*").replace("$instance", ".*")
}

/// What an expression's selectors produce: the labels their series carry.
#[derive(Default)]
struct Walk {
    problems: Vec<String>,
    metrics: BTreeSet<String>,
}

impl Walk {
    /// Checks `e` and returns the label names its result can carry.
    fn expr(&mut self, e: &Expr, x: &Exposition) -> BTreeSet<String> {
        match e {
            Expr::VectorSelector(vs) => self.selector(vs, x, false),
            Expr::MatrixSelector(ms) => self.selector(&ms.vs, x, true),
            Expr::Aggregate(a) => {
                let inner = self.expr(&a.expr, x);
                if let Some(p) = &a.param {
                    self.expr(p, x);
                }
                match &a.modifier {
                    Some(promql_parser::parser::LabelModifier::Include(l)) => {
                        for label in &l.labels {
                            if !inner.contains(label) {
                                self.problems.push(format!("by ({label}): no such label on the series aggregated ({inner:?})"));
                            }
                        }
                        l.labels.iter().cloned().collect()
                    }
                    Some(promql_parser::parser::LabelModifier::Exclude(l)) => inner.into_iter().filter(|k| !l.labels.contains(k)).collect(),
                    None => BTreeSet::new(),
                }
            }
            Expr::Binary(b) => {
                let (l, r) = (self.expr(&b.lhs, x), self.expr(&b.rhs, x));
                if let Some(m) = b.modifier.as_ref().and_then(|m| m.matching.as_ref()) {
                    for label in &m.labels().labels {
                        if !l.contains(label) && !r.contains(label) {
                            self.problems.push(format!("on/ignoring ({label}): no such label on either side"));
                        }
                    }
                }
                l.union(&r).cloned().collect()
            }
            Expr::Paren(p) => self.expr(&p.expr, x),
            Expr::Unary(u) => self.expr(&u.expr, x),
            Expr::Subquery(s) => self.expr(&s.expr, x),
            Expr::Call(c) => {
                let mut labels = BTreeSet::new();
                for arg in &c.args.args {
                    labels.extend(self.expr(arg, x));
                }
                labels
            }
            Expr::NumberLiteral(_) | Expr::StringLiteral(_) | Expr::Extension(_) => BTreeSet::new(),
        }
    }

    fn selector(&mut self, vs: &VectorSelector, x: &Exposition, range: bool) -> BTreeSet<String> {
        let Some(name) = &vs.name else {
            self.problems.push("selector without a metric name".into());
            return BTreeSet::new();
        };
        self.metrics.insert(name.clone());
        let Some((kind, labels)) = x.families.get(name) else {
            self.problems.push(format!("{name}: natrix exports no such metric"));
            return BTreeSet::new();
        };
        if range && kind != "counter" {
            self.problems.push(format!("{name}: a range function over a {kind}"));
        }
        for m in &vs.matchers.matchers {
            if TARGET_LABELS.contains(&m.name.as_str()) {
                continue;
            }
            let Some(values) = labels.get(&m.name) else {
                self.problems.push(format!("{name}{{{}}}: no such label (it has {:?})", m.name, labels.keys().collect::<Vec<_>>()));
                continue;
            };
            let ok = match &m.op {
                MatchOp::Equal => values.contains(&m.value),
                MatchOp::Re(_) => {
                    // Each alternative of a plain alternation must exist; any
                    // other pattern must match at least one value.
                    if m.value.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '|' || c == '.') && !m.value.contains(".*") {
                        m.value.split('|').all(|alt| values.contains(alt))
                    } else {
                        values.iter().any(|v| m.is_match(v))
                    }
                }
                MatchOp::NotEqual | MatchOp::NotRe(_) => true,
            };
            if !ok {
                self.problems.push(format!("{name}{{{}{}\"{}\"}}: no such value (it has {values:?})", m.name, m.op, m.value));
            }
        }
        labels.keys().cloned().chain(TARGET_LABELS.iter().map(|s| s.to_string())).collect()
    }
}

#[test]
fn every_dashboard_query_selects_what_natrix_exports() {
    let exposition = Exposition::natrix();
    let mut found = Vec::new();
    targets(&dashboard(), "", &mut found);
    assert!(found.len() >= 20, "only {} queries found", found.len());
    let mut problems = Vec::new();
    let mut used = BTreeSet::new();
    for (title, expr, legend) in &found {
        let ast = match parser::parse(&substitute(expr)) {
            Ok(ast) => ast,
            Err(e) => {
                problems.push(format!("{title}: {expr}: not PromQL: {e}"));
                continue;
            }
        };
        let mut walk = Walk::default();
        let labels = walk.expr(&ast, &exposition);
        // {{label}} in the legend must be a label of the result.
        for part in legend.split("{{").skip(1) {
            let label = part.split("}}").next().unwrap().trim();
            if !labels.contains(label) {
                walk.problems.push(format!("legend {{{{{label}}}}}: the result has no such label ({labels:?})"));
            }
        }
        problems.extend(walk.problems.into_iter().map(|p| format!("{title}: {expr}: {p}")));
        used.extend(walk.metrics);
    }
    assert!(problems.is_empty(), "dashboard queries that do not match natrix's metrics:\n{}", problems.join("\n"));

    // What the dashboard is for (issue 16): throughput per interface, drops
    // by reason, sessions and mappings by protocol, pool use, subscribers
    // near their limit, log loss, worker load.
    for needed in [
        "natrix_rx_packets_total",
        "natrix_tx_packets_total",
        "natrix_rx_bytes_total",
        "natrix_tx_bytes_total",
        "natrix_drops_total",
        "natrix_sessions",
        "natrix_mappings",
        "natrix_pool_ports_in_use",
        "natrix_pool_ports_total",
        "natrix_subscribers_port_use",
        "natrix_log_records_lost_total",
        "natrix_worker_busy_seconds_total",
    ] {
        assert!(used.contains(needed), "the dashboard never queries {needed}");
    }
}

#[test]
fn the_instance_variable_queries_an_exported_metric() {
    let exposition = Exposition::natrix();
    let d = dashboard();
    let vars = d["templating"]["list"].as_array().expect("templating.list");
    for v in vars.iter().filter(|v| v["type"] == "query") {
        let q = v["query"]["query"].as_str().or(v["query"].as_str()).expect("variable query");
        let inner = q.strip_prefix("label_values(").and_then(|r| r.strip_suffix(')')).unwrap_or_else(|| panic!("{q}: expected label_values(METRIC, LABEL)"));
        let (metric, label) = inner.split_once(',').unwrap();
        assert!(exposition.families.contains_key(metric.trim()), "{q}: natrix exports no {metric}");
        assert!(TARGET_LABELS.contains(&label.trim()), "{q}: {label} is not a scrape target label");
    }
    // Every panel queries the data source the dashboard's variable picks.
    let text = serde_json::to_string(&d).unwrap();
    assert!(!text.contains("\"uid\":\"prometheus\""), "a hard-coded data source uid");
}
