//! Where a key is written in a TOML document, so an error found after parsing
//! (a value out of range, two tenants of one name) still names its line. The
//! toml crate keeps spans while parsing; serde drops them, so the document is
//! walked again along the error's key path (`tenant[2].job[0].iodepth`).

use toml::de::{DeTable, DeValue};
use toml::Spanned;

enum Step<'k> {
    Key(&'k str),
    Index(usize),
}

/// `tenant[2].job[0].iodepth` → Key(tenant) Index(2) Key(job) Index(0) Key(iodepth).
fn steps(path: &str) -> Option<Vec<Step<'_>>> {
    let mut out = Vec::new();
    for part in path.split('.') {
        let (name, rest) = part.split_once('[').map_or((part, ""), |(n, r)| (n, r));
        if !name.is_empty() {
            out.push(Step::Key(name));
        }
        for index in rest.split('[').filter(|s| !s.is_empty()) {
            out.push(Step::Index(index.strip_suffix(']')?.parse().ok()?));
        }
    }
    Some(out)
}

/// 1-based line of the value at `path`, or of the deepest table or array on
/// the way to it when the key itself is absent (a default that is invalid
/// with another value). `None` when the text does not parse or the path is
/// not a key path.
pub fn line_of(text: &str, path: &str) -> Option<usize> {
    let root = DeTable::parse(text).ok()?;
    let mut span = None;
    let mut table: Option<&DeTable<'_>> = Some(root.get_ref());
    let mut value: Option<&Spanned<DeValue<'_>>> = None;
    for step in steps(path)? {
        let next = match (step, table, value.map(|v| v.get_ref())) {
            (Step::Key(k), Some(t), _) => t.get(k),
            (Step::Index(i), _, Some(DeValue::Array(a))) => a.get(i),
            _ => None,
        };
        let Some(next) = next else { break };
        span = Some(next.span());
        table = match next.get_ref() {
            DeValue::Table(t) => Some(t),
            _ => None,
        };
        value = Some(next);
    }
    span.map(|s| text[..s.start.min(text.len())].matches('\n').count() + 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    const DOC: &str = "name = \"x\"\n[device]\nparallelism = 0\n[[tenant]]\nname = \"a\"\n[[tenant.job]]\nrw = \"read\"\n[[tenant]]\nname = \"b\"\nfloor = \"0MB/s\"\n[[tenant.job]]\nrw = \"read\"\niodepth = 0\n";

    #[test]
    fn finds_nested_keys_and_array_elements() {
        assert_eq!(line_of(DOC, "device.parallelism"), Some(3));
        assert_eq!(line_of(DOC, "tenant[1].floor"), Some(10));
        assert_eq!(line_of(DOC, "tenant[1].job[0].iodepth"), Some(13));
        assert_eq!(line_of(DOC, "name"), Some(1));
    }

    #[test]
    fn a_missing_key_points_at_its_table() {
        let line = line_of(DOC, "tenant[0].job[0].iodepth").unwrap();
        assert!((6..=7).contains(&line), "{line}");
        assert_eq!(line_of("x = [", "x"), None);
        assert_eq!(line_of(DOC, "tenant[x]"), None);
    }
}
