//! The YAML front matter of a `SKILL.md`, parsed within bounds: third-party bytes that must
//! never cost more than a few milliseconds and a little memory, whatever they hold.
//!
//! The YAML library (a port of libyaml) is linear in its input except in two ways, and both
//! are closed before or while it runs:
//!
//! - its scanner costs as much per token as the flow collections (`[`, `{`) open around it,
//!   so deep flow nesting is quadratic: a linear pre-scan bounds the flow collections before
//!   the library sees the text ([`flow_openings`]);
//! - aliases are expanded as the document is read, so a few lines of aliases of aliases can
//!   stand for billions of values: the values are built by a visitor ([`Node`]) that counts
//!   every value and string byte it is handed, aliases included, and stops at a budget.
//!
//! Every refusal is a typed error naming the file and the bound (`details.bound`,
//! `details.limit`): TOO_LARGE for a bound, INVALID_ARGUMENT for YAML that is not valid.

use cloud_harness_error::{Code, Error, Result};
use serde::de::{self, DeserializeSeed, Visitor};
use std::cell::Cell;
use std::fmt;
use yaml_serde::value::{Tag, TaggedValue};
use yaml_serde::{Mapping, Value};

/// The bounds. Real front matters are far inside them: in 1,462 public `SKILL.md` files the
/// largest front matter was 1,156 bytes, none nested a flow collection in another, and none
/// used an anchor.
pub const MAX_BYTES: usize = 64 << 10;
/// Collections inside collections, flow (`[`, `{`) or block.
pub const MAX_NESTING: usize = 32;
/// `[` and `{` in the whole front matter (see [`flow_openings`]): this bounds the scanner's
/// cost per token, so at most 64 times a linear pass.
pub const MAX_FLOW_OPENINGS: usize = 64;
/// Values of any kind (mapping keys too), every alias counted as the values it stands for.
pub const MAX_NODES: usize = 4096;
/// Bytes of all strings together, aliases expanded.
pub const MAX_TEXT_BYTES: usize = 128 << 10;
/// Keys of one mapping.
pub const MAX_KEYS: usize = 256;
/// Bytes of one string.
pub const MAX_STRING_BYTES: usize = 16 << 10;

/// One of the bounds, as errors name it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Bound {
    Bytes,
    FlowOpenings,
    Nesting,
    Nodes,
    TextBytes,
    Keys,
    StringBytes,
}

impl Bound {
    pub fn name(self) -> &'static str {
        match self {
            Bound::Bytes => "front_matter_bytes",
            Bound::FlowOpenings => "flow_openings",
            Bound::Nesting => "nesting",
            Bound::Nodes => "nodes",
            Bound::TextBytes => "text_bytes",
            Bound::Keys => "keys",
            Bound::StringBytes => "string_bytes",
        }
    }

    pub fn limit(self) -> usize {
        match self {
            Bound::Bytes => MAX_BYTES,
            Bound::FlowOpenings => MAX_FLOW_OPENINGS,
            Bound::Nesting => MAX_NESTING,
            Bound::Nodes => MAX_NODES,
            Bound::TextBytes => MAX_TEXT_BYTES,
            Bound::Keys => MAX_KEYS,
            Bound::StringBytes => MAX_STRING_BYTES,
        }
    }

    fn describe(self) -> String {
        let n = self.limit();
        match self {
            Bound::Bytes => format!("is larger than the limit of {n} bytes"),
            Bound::FlowOpenings => format!(
                "opens more than the limit of {n} flow collections (`[` or `{{`, counted wherever they stand)"
            ),
            Bound::Nesting => format!("nests collections deeper than the limit of {n} levels"),
            Bound::Nodes => format!("holds more than the limit of {n} values (aliases expanded)"),
            Bound::TextBytes => {
                format!("holds more than the limit of {n} bytes of text (aliases expanded)")
            }
            Bound::Keys => format!("has a mapping of more than the limit of {n} keys"),
            Bound::StringBytes => format!("has a string longer than the limit of {n} bytes"),
        }
    }

    /// The TOO_LARGE error of this bound.
    pub fn error(self) -> Error {
        Error::too_large(format!(
            "SKILL.md front matter {} (bound `{}`)",
            self.describe(),
            self.name()
        ))
        .with_details(serde_json::json!({
            "file": "SKILL.md",
            "bound": self.name(),
            "limit": self.limit(),
        }))
    }
}

/// The front matter `text` (what sits between the `---` lines) as a YAML value, within the
/// bounds.
pub fn parse(text: &str) -> Result<Value> {
    if text.len() > MAX_BYTES {
        return Err(Bound::Bytes.error());
    }
    if text.contains('\0') {
        return Err(Error::invalid("SKILL.md front matter holds NUL bytes")
            .with_details(serde_json::json!({ "file": "SKILL.md" })));
    }
    if flow_openings(text.as_bytes()) > MAX_FLOW_OPENINGS {
        return Err(Bound::FlowOpenings.error());
    }
    let budget = Budget::default();
    let root = Node {
        budget: &budget,
        depth: 0,
    };
    root.deserialize(yaml_serde::Deserializer::from_str(text))
        .map_err(|e| match budget.exceeded.get() {
            Some(bound) => bound.error(),
            None => Error::new(
                Code::InvalidArgument,
                format!("SKILL.md front matter is not valid YAML: {e}"),
            )
            .with_details(serde_json::json!({ "file": "SKILL.md" })),
        })
}

/// The flow collections `text` could open: every `[` and `{`, wherever it stands. An upper
/// bound on the flow nesting the YAML scanner can meet, found without parsing: a bracket in a
/// string or a comment counts too, so no quoting can hide an opening, and a closing bracket is
/// never trusted to end one (it could be the one a string holds).
pub fn flow_openings(text: &[u8]) -> usize {
    text.iter().filter(|&&b| b == b'[' || b == b'{').count()
}

/// What the values of one front matter have cost so far, and the bound that stopped them.
#[derive(Default)]
struct Budget {
    nodes: Cell<usize>,
    text_bytes: Cell<usize>,
    exceeded: Cell<Option<Bound>>,
}

impl Budget {
    fn exceed<E: de::Error>(&self, bound: Bound) -> E {
        self.exceeded.set(Some(bound));
        E::custom(format_args!("bound `{}` exceeded", bound.name()))
    }

    fn node<E: de::Error>(&self) -> Result<(), E> {
        self.nodes.set(self.nodes.get() + 1);
        if self.nodes.get() > MAX_NODES {
            return Err(self.exceed(Bound::Nodes));
        }
        Ok(())
    }

    fn text<E: de::Error>(&self, s: &str) -> Result<(), E> {
        self.node()?;
        if s.len() > MAX_STRING_BYTES {
            return Err(self.exceed(Bound::StringBytes));
        }
        self.text_bytes.set(self.text_bytes.get() + s.len());
        if self.text_bytes.get() > MAX_TEXT_BYTES {
            return Err(self.exceed(Bound::TextBytes));
        }
        Ok(())
    }
}

/// One value at `depth` collections down, built as `yaml_serde::Value`'s own visitor builds
/// it, each piece paid for before it is made. Aliases reach the visitor as the values they
/// stand for, so an expansion pays for every copy.
#[derive(Clone, Copy)]
struct Node<'b> {
    budget: &'b Budget,
    depth: usize,
}

impl Node<'_> {
    fn child<E: de::Error>(self) -> Result<Self, E> {
        self.budget.node()?;
        if self.depth >= MAX_NESTING {
            return Err(self.budget.exceed(Bound::Nesting));
        }
        Ok(Node {
            budget: self.budget,
            depth: self.depth + 1,
        })
    }
}

impl<'de> DeserializeSeed<'de> for Node<'_> {
    type Value = Value;

    fn deserialize<D: de::Deserializer<'de>>(self, deserializer: D) -> Result<Value, D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Node<'_> {
    type Value = Value;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("any YAML value")
    }

    fn visit_bool<E: de::Error>(self, b: bool) -> Result<Value, E> {
        self.budget.node()?;
        Ok(Value::Bool(b))
    }

    fn visit_i64<E: de::Error>(self, i: i64) -> Result<Value, E> {
        self.budget.node()?;
        Ok(Value::Number(i.into()))
    }

    fn visit_u64<E: de::Error>(self, u: u64) -> Result<Value, E> {
        self.budget.node()?;
        Ok(Value::Number(u.into()))
    }

    fn visit_f64<E: de::Error>(self, f: f64) -> Result<Value, E> {
        self.budget.node()?;
        Ok(Value::Number(f.into()))
    }

    fn visit_str<E: de::Error>(self, s: &str) -> Result<Value, E> {
        self.budget.text(s)?;
        Ok(Value::String(s.to_owned()))
    }

    fn visit_string<E: de::Error>(self, s: String) -> Result<Value, E> {
        self.budget.text(&s)?;
        Ok(Value::String(s))
    }

    fn visit_unit<E: de::Error>(self) -> Result<Value, E> {
        self.budget.node()?;
        Ok(Value::Null)
    }

    fn visit_none<E: de::Error>(self) -> Result<Value, E> {
        self.visit_unit()
    }

    fn visit_some<D: de::Deserializer<'de>>(self, deserializer: D) -> Result<Value, D::Error> {
        self.deserialize(deserializer)
    }

    fn visit_seq<A: de::SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let item = self.child()?;
        let mut items = Vec::new();
        while let Some(value) = seq.next_element_seed(item)? {
            items.push(value);
        }
        Ok(Value::Sequence(items))
    }

    fn visit_map<A: de::MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let item = self.child()?;
        let mut mapping = Mapping::new();
        while let Some(key) = map.next_key_seed(item)? {
            if mapping.len() == MAX_KEYS {
                return Err(self.budget.exceed(Bound::Keys));
            }
            // As `Mapping`'s own visitor: a key given twice is an error.
            if mapping.contains_key(&key) {
                return Err(de::Error::custom(duplicate(&key)));
            }
            let value = map.next_value_seed(item)?;
            mapping.insert(key, value);
        }
        Ok(Value::Mapping(mapping))
    }

    fn visit_enum<A: de::EnumAccess<'de>>(self, data: A) -> Result<Value, A::Error> {
        use de::VariantAccess;
        let (tag, contents) = data.variant_seed(TagSeed(self.budget))?;
        let value = contents.newtype_variant_seed(self.child()?)?;
        Ok(Value::Tagged(Box::new(TaggedValue {
            tag: Tag::new(tag),
            value,
        })))
    }
}

/// The error of a key given twice, worded as `yaml_serde` words it.
fn duplicate(key: &Value) -> String {
    match key {
        Value::Null => "duplicate entry with null key".into(),
        Value::Bool(b) => format!("duplicate entry with key `{b}`"),
        Value::Number(n) => format!("duplicate entry with key {n}"),
        Value::String(s) => format!("duplicate entry with key {s:?}"),
        _ => "duplicate entry in YAML map".into(),
    }
}

/// The tag of a tagged value: a string that is not empty (`Tag::new` refuses an empty one),
/// paid for as text (an alias repeats it).
struct TagSeed<'b>(&'b Budget);

impl<'de> DeserializeSeed<'de> for TagSeed<'_> {
    type Value = String;

    fn deserialize<D: de::Deserializer<'de>>(self, deserializer: D) -> Result<String, D::Error> {
        deserializer.deserialize_string(self)
    }
}

impl Visitor<'_> for TagSeed<'_> {
    type Value = String;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a YAML tag string")
    }

    fn visit_str<E: de::Error>(self, s: &str) -> Result<String, E> {
        if s.is_empty() {
            return Err(E::custom("empty YAML tag is not allowed"));
        }
        self.0.text(s)?;
        Ok(s.to_owned())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ALL: [Bound; 7] = [
        Bound::Bytes,
        Bound::FlowOpenings,
        Bound::Nesting,
        Bound::Nodes,
        Bound::TextBytes,
        Bound::Keys,
        Bound::StringBytes,
    ];

    /// The bound `text` is refused for, checked to be named with its limit.
    fn refused_by(text: &str) -> Option<&'static str> {
        let e = parse(text).err()?;
        assert_eq!(e.code, Code::TooLarge, "{e}");
        let bound = ALL
            .into_iter()
            .find(|b| e.details["bound"] == b.name())
            .unwrap_or_else(|| panic!("no bound named: {e}"));
        assert_eq!(e.details["limit"], bound.limit(), "{e}");
        assert_eq!(e.details["file"], "SKILL.md", "{e}");
        assert!(e.message.contains(bound.name()), "{e}");
        Some(bound.name())
    }

    /// Aliases of aliases: nine lines that stand for 9^9 strings.
    fn laughs(levels: usize, width: usize) -> String {
        let mut text = String::from("description: x\na0: &a0 \"lol\"\n");
        for level in 1..=levels {
            let refs = vec![format!("*a{}", level - 1); width].join(", ");
            text += &format!("a{level}: &a{level} [{refs}]\n");
        }
        text
    }

    #[test]
    fn an_alias_bomb_is_refused_for_its_values() {
        assert_eq!(refused_by(&laughs(9, 9)), Some("nodes"));
        // A long string repeated by aliases runs out of text first.
        let long = "x".repeat(MAX_STRING_BYTES);
        let text = format!("description: &s {long}\nmore: [*s, *s, *s, *s, *s, *s, *s, *s, *s]\n");
        assert_eq!(refused_by(&text), Some("text_bytes"));
        // An alias or two is fine.
        let value = parse("base: &b {a: 1}\nother: *b\n").unwrap();
        assert_eq!(value["other"]["a"], Value::Number(1.into()));
    }

    #[test]
    fn deep_nesting_is_refused_before_the_parser_sees_it() {
        for open in ["[", "{", "{a: ", "[{a: "] {
            let text = format!("description: {}", open.repeat(MAX_BYTES / open.len() - 20));
            assert_eq!(refused_by(&text), Some("flow_openings"), "{open}");
        }
        // Closings cannot pay for openings: a string can hold them.
        let hidden = format!("a: {}", "[\"]\"".repeat(MAX_FLOW_OPENINGS + 1));
        assert_eq!(refused_by(&hidden), Some("flow_openings"));
        // The mapping of fields is the first level.
        let at_limit = format!(
            "a: {}x{}",
            "[".repeat(MAX_NESTING - 1),
            "]".repeat(MAX_NESTING - 1)
        );
        assert_eq!(refused_by(&at_limit), None);
        let past = format!("a: {}x{}", "[".repeat(MAX_NESTING), "]".repeat(MAX_NESTING));
        assert_eq!(refused_by(&past), Some("nesting"));
        // Block nesting is counted by the visitor.
        let mut block = String::new();
        for depth in 0..=MAX_NESTING {
            block += &format!("{}k{depth}:\n", " ".repeat(depth));
        }
        block += &format!("{}leaf: 1\n", " ".repeat(MAX_NESTING + 1));
        assert_eq!(refused_by(&block), Some("nesting"));
        assert_eq!(refused_by(&"- ".repeat(MAX_NESTING + 1)), Some("nesting"));
    }

    #[test]
    fn front_matters_as_toolkits_write_them_parse() {
        let text = "name: tdd\ndescription: \"Use [this] when [that]\"\nargument-hint: \"[file] [options]\"\nallowed-tools: [\"Read\", \"Bash(git:*)\"]\nmetadata: {tags: [a, b], owner: {team: x}}\nhooks:\n  PreToolUse:\n    - matcher: Bash\n      hooks:\n        - type: command\n          command: ./check.sh\n";
        let value = parse(text).unwrap();
        assert_eq!(
            value["metadata"]["owner"]["team"],
            Value::String("x".into())
        );
        assert_eq!(flow_openings(text.as_bytes()), 8);
    }

    #[test]
    fn keys_and_strings_are_bounded() {
        let keys: String = (0..=MAX_KEYS).map(|i| format!("k{i}: v\n")).collect();
        assert_eq!(refused_by(&keys), Some("keys"));
        let long = format!("description: {}\n", "x".repeat(MAX_STRING_BYTES + 1));
        assert_eq!(refused_by(&long), Some("string_bytes"));
        let big = format!("description: x\n#{}\n", "x".repeat(MAX_BYTES));
        assert_eq!(refused_by(&big), Some("front_matter_bytes"));
    }

    #[test]
    fn other_problems_are_invalid_yaml() {
        for text in ["a: [unclosed", "a: 1\na: 2", "a: *nowhere", "\t- x: ["] {
            let e = parse(text).unwrap_err();
            assert_eq!(e.code, Code::InvalidArgument, "{text}: {e}");
            assert!(e.message.contains("not valid YAML"), "{e}");
        }
        assert!(parse("a: 1\na: 2")
            .unwrap_err()
            .message
            .contains("duplicate entry with key \"a\""));
    }

    /// The worst inputs at the size bound: each is refused or parsed at once. Run with
    /// `--nocapture` to see what each cost.
    #[test]
    fn the_worst_inputs_at_the_size_bound_stay_cheap() {
        let fill = |unit: &str| unit.repeat(MAX_BYTES / unit.len() - 1);
        let nested = |depth: usize, inner: &str| {
            let body = inner.repeat((MAX_BYTES - 2 * depth - 8) / inner.len());
            format!("a: {}{body}{}", "[".repeat(depth), "]".repeat(depth))
        };
        let cases = [
            ("alias bomb", laughs(9, 9), Some("nodes")),
            ("wide alias bomb", laughs(3, 1000), Some("nodes")),
            (
                // 40,000 copies of a long string in few alias jumps (what once aborted).
                "long strings aliased",
                format!(
                    "a0: &a0 {}\na1: &a1 [{}]\na2: [{}]\n",
                    "x".repeat(MAX_STRING_BYTES - 100),
                    vec!["*a0"; 200].join(", "),
                    vec!["*a1"; 200].join(", ")
                ),
                Some("text_bytes"),
            ),
            ("flow openings", fill("["), Some("flow_openings")),
            ("mapping openings", fill("{a: "), Some("flow_openings")),
            ("hidden closings", fill("[\"]\""), Some("flow_openings")),
            (
                "tokens, nested",
                nested(MAX_NESTING - 2, "x,"),
                Some("nodes"),
            ),
            (
                "strings, nested",
                nested(MAX_NESTING - 2, "'x', "),
                Some("nodes"),
            ),
            (
                "tokens, every opening nested",
                nested(MAX_FLOW_OPENINGS, "x,"),
                Some("nesting"),
            ),
            ("block entries", fill("- "), Some("nesting")),
            ("anchors", fill("- &a x\n"), Some("nodes")),
            ("quotes", fill("'"), None),
            ("backslashes", format!("\"{}\"", fill("\\\\")), None),
            (
                "one long line",
                format!("description: {}", "x".repeat(MAX_BYTES - 20)),
                Some("string_bytes"),
            ),
        ];
        for (name, text, bound) in cases {
            assert!(text.len() <= MAX_BYTES, "{name}");
            let started = std::time::Instant::now();
            let got = match parse(&text) {
                Ok(_) => None,
                Err(e) if e.code == Code::TooLarge => {
                    e.details["bound"].as_str().map(str::to_owned)
                }
                Err(_) => Some("invalid".to_owned()),
            };
            eprintln!(
                "{name}: {} bytes, {:?}, {got:?}",
                text.len(),
                started.elapsed()
            );
            if let Some(bound) = bound {
                assert_eq!(got.as_deref(), Some(bound), "{name}");
            }
        }
    }
}
