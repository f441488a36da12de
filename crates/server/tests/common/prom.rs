//! A strict parser of the Prometheus text exposition format 0.0.4, test-side: it rejects
//! what the format does not allow (a sample before its family's TYPE, a family split in two,
//! bad names, bad escapes, duplicate series, inconsistent histograms) instead of grepping.

use std::collections::{BTreeMap, HashMap, HashSet};

/// A series: the metric name and its labels (sorted).
pub type Series = (String, BTreeMap<String, String>);

#[derive(Debug, Default)]
pub struct Exposition {
    /// Family name -> type (counter, gauge, histogram, summary, untyped).
    pub types: HashMap<String, String>,
    pub help: HashMap<String, String>,
    pub samples: HashMap<Series, f64>,
}

impl Exposition {
    /// The value of `name{labels}` (labels given as pairs; order does not matter).
    pub fn value(&self, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        let labels = labels
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        self.samples.get(&(name.to_string(), labels)).copied()
    }

    /// Sum of every series of `name`.
    pub fn sum(&self, name: &str) -> f64 {
        self.samples
            .iter()
            .filter(|((n, _), _)| n == name)
            .map(|(_, v)| v)
            .sum()
    }
}

fn valid_name(name: &str) -> bool {
    let mut chars = name.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_alphabetic() || c == '_' || c == ':')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
}

fn valid_label_name(name: &str) -> bool {
    let mut chars = name.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// The family a sample name belongs to (`_bucket`, `_sum`, `_count` of a histogram).
fn family_of<'a>(name: &'a str, types: &HashMap<String, String>) -> &'a str {
    for suffix in ["_bucket", "_sum", "_count"] {
        if let Some(base) = name.strip_suffix(suffix) {
            if types
                .get(base)
                .is_some_and(|t| t == "histogram" || t == "summary")
            {
                return base;
            }
        }
    }
    name
}

fn parse_value(text: &str) -> Result<f64, String> {
    match text {
        "+Inf" => Ok(f64::INFINITY),
        "-Inf" => Ok(f64::NEG_INFINITY),
        "NaN" => Ok(f64::NAN),
        _ => text.parse().map_err(|_| format!("bad value {text:?}")),
    }
}

/// `{a="x",b="y"}` starting at `rest[0] == '{'`: the labels and what follows the `}`.
fn parse_labels(rest: &str) -> Result<(BTreeMap<String, String>, &str), String> {
    let mut labels = BTreeMap::new();
    let mut s = &rest[1..];
    loop {
        if let Some(after) = s.strip_prefix('}') {
            return Ok((labels, after));
        }
        let eq = s.find('=').ok_or("label without =")?;
        let name = &s[..eq];
        if !valid_label_name(name) {
            return Err(format!("bad label name {name:?}"));
        }
        s = s[eq + 1..]
            .strip_prefix('"')
            .ok_or("label value not quoted")?;
        let mut value = String::new();
        let mut chars = s.char_indices();
        let end = loop {
            match chars.next() {
                Some((i, '"')) => break i,
                Some((_, '\\')) => match chars.next() {
                    Some((_, '\\')) => value.push('\\'),
                    Some((_, '"')) => value.push('"'),
                    Some((_, 'n')) => value.push('\n'),
                    other => return Err(format!("bad escape {other:?}")),
                },
                Some((_, '\n')) | None => return Err("unterminated label value".into()),
                Some((_, c)) => value.push(c),
            }
        };
        if labels.insert(name.to_string(), value).is_some() {
            return Err(format!("label {name} twice"));
        }
        s = &s[end + 1..];
        if let Some(after) = s.strip_prefix(',') {
            s = after;
        } else if !s.starts_with('}') {
            return Err("expected , or } after a label".into());
        }
    }
}

pub fn parse(text: &str) -> Result<Exposition, String> {
    let mut exp = Exposition::default();
    let mut finished: HashSet<String> = HashSet::new();
    let mut current: Option<String> = None;
    for (n, line) in text.lines().enumerate() {
        let at = |e: String| format!("line {}: {e}: {line:?}", n + 1);
        if line.is_empty() {
            continue;
        }
        if let Some(comment) = line.strip_prefix('#') {
            let mut words = comment.trim_start().splitn(3, ' ');
            let keyword = words.next().unwrap_or("");
            if keyword != "HELP" && keyword != "TYPE" {
                continue;
            }
            let name = words.next().ok_or_else(|| at("no metric name".into()))?;
            let rest = words.next().unwrap_or("");
            if !valid_name(name) {
                return Err(at(format!("bad name {name}")));
            }
            if current.as_deref() != Some(name) {
                if let Some(prev) = current.take() {
                    finished.insert(prev);
                }
                if finished.contains(name) {
                    return Err(at(format!("family {name} split")));
                }
                current = Some(name.to_string());
            }
            if keyword == "TYPE" {
                if !["counter", "gauge", "histogram", "summary", "untyped"].contains(&rest) {
                    return Err(at(format!("bad type {rest}")));
                }
                if exp.types.insert(name.into(), rest.into()).is_some() {
                    return Err(at("TYPE twice".into()));
                }
            } else if exp.help.insert(name.into(), rest.into()).is_some() {
                return Err(at("HELP twice".into()));
            }
            continue;
        }
        let name_end = line.find(['{', ' ']).ok_or_else(|| at("no value".into()))?;
        let name = &line[..name_end];
        if !valid_name(name) {
            return Err(at(format!("bad name {name}")));
        }
        let (labels, rest) = if line[name_end..].starts_with('{') {
            parse_labels(&line[name_end..]).map_err(at)?
        } else {
            (BTreeMap::new(), &line[name_end..])
        };
        let mut fields = rest.split_whitespace();
        let value = parse_value(fields.next().ok_or_else(|| at("no value".into()))?).map_err(at)?;
        if let Some(ts) = fields.next() {
            ts.parse::<i64>().map_err(|_| at("bad timestamp".into()))?;
        }
        let family = family_of(name, &exp.types);
        if current.as_deref() != Some(family) {
            return Err(at(format!(
                "sample outside its family {family} (TYPE first)"
            )));
        }
        if exp
            .samples
            .insert((name.to_string(), labels), value)
            .is_some()
        {
            return Err(at("duplicate series".into()));
        }
    }
    check_histograms(&exp)?;
    Ok(exp)
}

/// Buckets cumulative, `+Inf` present and equal to `_count`.
fn check_histograms(exp: &Exposition) -> Result<(), String> {
    for (family, kind) in &exp.types {
        if kind != "histogram" {
            continue;
        }
        let bucket = format!("{family}_bucket");
        let mut groups: BTreeMap<BTreeMap<String, String>, Vec<(f64, f64)>> = BTreeMap::new();
        for ((name, labels), value) in &exp.samples {
            if *name != bucket {
                continue;
            }
            let mut key = labels.clone();
            let le = key.remove("le").ok_or(format!("{bucket} without le"))?;
            groups
                .entry(key)
                .or_default()
                .push((parse_value(&le)?, *value));
        }
        for (labels, mut buckets) in groups {
            buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
            if buckets.windows(2).any(|w| w[1].1 < w[0].1) {
                return Err(format!("{family}{labels:?}: buckets not cumulative"));
            }
            let Some(&(le, inf)) = buckets.last() else {
                continue;
            };
            if le != f64::INFINITY {
                return Err(format!("{family}{labels:?}: no +Inf bucket"));
            }
            let count = exp
                .samples
                .get(&(format!("{family}_count"), labels.clone()))
                .ok_or(format!("{family}{labels:?}: no _count"))?;
            if *count != inf {
                return Err(format!("{family}{labels:?}: +Inf {inf} != count {count}"));
            }
            if !exp
                .samples
                .contains_key(&(format!("{family}_sum"), labels.clone()))
            {
                return Err(format!("{family}{labels:?}: no _sum"));
            }
        }
    }
    Ok(())
}
