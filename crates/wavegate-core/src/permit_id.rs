//! Permit ids, made and parsed in one place.
//!
//! A permit id is chosen by the client, so that an acquire whose reply was lost can be sent
//! again without creating a second permit. It names the process that holds the permit (its
//! [`Instance`]) and a sequence number unique within it; on an upstream with priority classes
//! it also names the permit's class and tenant, so the store counts each class's and each
//! tenant's permits from the ids alone (the tenant's key itself never leaves the process: the
//! id carries its [`TenantTag`]).
//!
//! | upstream | text |
//! |---|---|
//! | without classes | `<instance>:<sequence>` |
//! | with classes | `<class>\|<instance>:<sequence>\|<tenant tag or ->` |
//!
//! The third field (`-` when no tenant is named) also says that the permit's process renews it
//! every second (see `UpstreamConfig::class_count_window`); ids of older releases have only
//! two fields. The Lua scripts read the same layout (`lua/priority.lua`: `class_of`,
//! `tenant_of`).
//!
//! ```
//! use wavegate_core::{Instance, PermitId, TenantTag};
//!
//! let instance = Instance::new("42-00ff").unwrap();
//! let plain = PermitId::new(None, &instance, 7, None);
//! assert_eq!(plain.as_str(), "42-00ff:7");
//! let tagged = PermitId::new(Some("batch"), &instance, 8, Some(TenantTag::of("acme")));
//! assert_eq!(PermitId::parse(tagged.as_str()), Ok(tagged.clone()));
//! assert_eq!(tagged.class(), Some("batch"));
//! assert_eq!(tagged.instance(), "42-00ff");
//! assert_eq!(tagged.sequence(), 8);
//! ```

use std::fmt;
use std::hash::{Hash, Hasher};
use std::sync::Arc;

use crate::tenant::NO_TENANT;

/// One process's name at a gate: the prefix of its permit ids, its member on the waiting
/// list and its heartbeat. Unique across the fleet (the pid is not enough: pids repeat across
/// containers).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Instance(Arc<str>);

impl Instance {
    /// The instance `name`: non-empty, at most 128 bytes, without `|`, `:` or whitespace.
    pub fn new(name: impl Into<String>) -> Result<Self, BadPermitId> {
        let name = name.into();
        let bad = name.is_empty()
            || name.len() > 128
            || name.chars().any(|c| c == '|' || c == ':' || c == '>' || c == ',' || c.is_whitespace());
        if bad {
            return Err(BadPermitId::new(
                &name,
                "an instance is 1 to 128 characters without `|`, `:`, `>`, `,` or spaces",
            ));
        }
        Ok(Self(name.into()))
    }

    /// A new instance for this process: its pid and 128 random bits.
    pub fn random() -> Self {
        use rand::Rng;
        let nonce: u128 = rand::rng().random();
        Self(format!("{}-{nonce:032x}", std::process::id()).into())
    }

    /// The name.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for Instance {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// How a tenant appears outside the process: a 64-bit hash of its key
/// ([`tenant_tag`](crate::tenant::tenant_tag)), written as 16 hex digits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TenantTag(u64);

impl TenantTag {
    /// The tag of tenant key `key`.
    pub fn of(key: &str) -> Self {
        Self(crate::tenant::tenant_hash(key))
    }

    /// The tag written as 16 hex digits, as `text` is; `None` for anything else.
    pub fn parse(text: &str) -> Option<Self> {
        (text.len() == 16 && text.bytes().all(|b| b.is_ascii_hexdigit()))
            .then(|| u64::from_str_radix(text, 16).ok().map(Self))
            .flatten()
    }
}

impl fmt::Display for TenantTag {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:016x}", self.0)
    }
}

/// A text that is not a permit id (or an instance name): what it is, and why not.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("`{text}` is not a wavegate permit id: {reason}")]
pub struct BadPermitId {
    /// The text (cut to 80 characters).
    pub text: String,
    /// What is wrong with it.
    pub reason: &'static str,
}

impl BadPermitId {
    fn new(text: &str, reason: &'static str) -> Self {
        Self { text: text.chars().take(80).collect(), reason }
    }
}

/// A permit id: its class (on an upstream with classes), the instance that holds it, a
/// sequence number, and its tenant's tag. Made with [`new`](Self::new), read back from the
/// store with [`parse`](Self::parse); its text ([`as_str`](Self::as_str)) is rendered once.
/// Two ids are equal when their texts are.
#[derive(Clone)]
pub struct PermitId {
    text: Arc<str>,
    /// `Some(end of the class name)` for ids with a class.
    class_end: Option<usize>,
    instance: (usize, usize),
    sequence: u64,
    /// The id's third field: `None` for a two-field id; `Some(None)` for `-`.
    tenant: Option<Option<TenantTag>>,
}

impl PermitId {
    /// The id of permit `sequence` of `instance`: in `class` with `tenant` on an upstream with
    /// classes (the three-field form, `-` without a tenant); `<instance>:<sequence>` without
    /// a class (a tenant is then not part of the id).
    pub fn new(class: Option<&str>, instance: &Instance, sequence: u64, tenant: Option<TenantTag>) -> Self {
        match class {
            None => {
                let text = format!("{instance}:{sequence}");
                let end = instance.as_str().len();
                Self { text: text.into(), class_end: None, instance: (0, end), sequence, tenant: None }
            }
            Some(class) => {
                let tag = tenant.map_or_else(|| NO_TENANT.to_owned(), |tag| tag.to_string());
                let text = format!("{class}|{instance}:{sequence}|{tag}");
                let start = class.len() + 1;
                Self {
                    text: text.into(),
                    class_end: Some(class.len()),
                    instance: (start, start + instance.as_str().len()),
                    sequence,
                    tenant: Some(tenant),
                }
            }
        }
    }

    /// Reads an id back (from a script's reply, a renewal): either form.
    pub fn parse(text: &str) -> Result<Self, BadPermitId> {
        let bad = |reason| BadPermitId::new(text, reason);
        let fields: Vec<&str> = text.split('|').collect();
        let (class, body, tenant) = match fields.as_slice() {
            [body] => (None, *body, None),
            [class, body] => (Some(*class), *body, None),
            [class, body, tag] if *tag == NO_TENANT => (Some(*class), *body, Some(None)),
            [class, body, tag] => {
                let tag = TenantTag::parse(tag).ok_or_else(|| bad("its tenant tag is not 16 hex digits"))?;
                (Some(*class), *body, Some(Some(tag)))
            }
            _ => return Err(bad("it has more than three `|`-separated fields")),
        };
        if class.is_some_and(str::is_empty) {
            return Err(bad("its class is empty"));
        }
        let (instance, sequence) = body.rsplit_once(':').ok_or_else(|| bad("it has no `:<sequence>`"))?;
        let sequence = sequence.parse::<u64>().map_err(|_| bad("its sequence is not a number"))?;
        Instance::new(instance).map_err(|_| bad("its instance is not an instance name"))?;
        let start = class.map_or(0, |c| c.len() + 1);
        Ok(Self {
            text: text.into(),
            class_end: class.map(str::len),
            instance: (start, start + instance.len()),
            sequence,
            tenant,
        })
    }

    /// The id's text, as the store keeps it.
    pub fn as_str(&self) -> &str {
        &self.text
    }

    /// The class it names, if it has one.
    pub fn class(&self) -> Option<&str> {
        self.class_end.map(|end| &self.text[..end])
    }

    /// The instance that holds it.
    pub fn instance(&self) -> &str {
        &self.text[self.instance.0..self.instance.1]
    }

    /// Its sequence number within its instance.
    pub fn sequence(&self) -> u64 {
        self.sequence
    }

    /// Its tenant's tag, if it names one.
    pub fn tenant(&self) -> Option<TenantTag> {
        self.tenant.flatten()
    }

    /// Whether its process renews it every second (the three-field form; see the module docs).
    pub fn renewed_every_second(&self) -> bool {
        self.tenant.is_some()
    }
}

impl PartialEq for PermitId {
    fn eq(&self, other: &Self) -> bool {
        self.text == other.text
    }
}

impl Eq for PermitId {}

/// Hashes the sequence and the text's length, not the whole text: equal ids have equal ones,
/// and the sequence alone tells apart the ids of one instance (a lane's, a gate's), which are
/// most of any map of them. Cheap, where hashing the whole text was a tenth of a local permit.
impl Hash for PermitId {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.sequence.hash(state);
        self.text.len().hash(state);
    }
}

impl AsRef<str> for PermitId {
    fn as_ref(&self) -> &str {
        &self.text
    }
}

impl fmt::Debug for PermitId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "PermitId({})", self.text)
    }
}

impl fmt::Display for PermitId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

/// How the store reads an id's text, typed or not (the twins of `class_of` and `tenant_of` in
/// `lua/priority.lua`, so that both gates count the same permits for the same classes and
/// tenants whatever the text): what [`PermitId::new`] writes reads back as its class, its
/// tag (or [`NO_TENANT`]) and the three-field form; a text of another shape (an older
/// release's id, a test's name) counts for the default class and no tenant.
pub(crate) mod text {
    use crate::tenant::NO_TENANT;

    /// The class an id or a waiting member (`<class>|...`) names: the text before its first
    /// `|`, if it has one.
    pub(crate) fn class_of(text: &str) -> Option<&str> {
        text.split_once('|').map(|(class, _)| class)
    }

    /// The tenant tag of an id (`<class>|<instance>:<n>|<tag>`: all after the second `|`), or
    /// [`NO_TENANT`].
    pub(crate) fn tenant_of(text: &str) -> &str {
        match text.split_once('|').and_then(|(_, rest)| rest.split_once('|')) {
            Some((_, tag)) if !tag.is_empty() => tag,
            _ => NO_TENANT,
        }
    }

    /// Whether an id has the third field, so its process renews it every second.
    pub(crate) fn renewed_every_second(text: &str) -> bool {
        text.split_once('|').is_some_and(|(_, rest)| rest.contains('|'))
    }

    /// The instance of a waiting member (`<class>|<instance>`, or the instance alone).
    pub(crate) fn member_instance(member: &str) -> &str {
        member.split_once('|').map_or(member, |(_, instance)| instance)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_forms_round_trip_and_bad_texts_are_refused() {
        let instance = Instance::new("7-ab").unwrap();
        for id in [
            PermitId::new(None, &instance, 1, None),
            PermitId::new(Some("interactive"), &instance, 2, None),
            PermitId::new(Some("batch"), &instance, u64::MAX, Some(TenantTag::of("t"))),
        ] {
            let back = PermitId::parse(id.as_str()).unwrap();
            assert_eq!(back, id);
            assert_eq!(
                (back.class(), back.instance(), back.sequence(), back.tenant()),
                (id.class(), "7-ab", id.sequence(), id.tenant())
            );
        }
        // An older release's class id (two fields): a class, no tenant, not renewed every second.
        let old = PermitId::parse("batch|7-ab:3").unwrap();
        assert_eq!((old.class(), old.tenant(), old.renewed_every_second()), (Some("batch"), None, false));
        assert!(PermitId::parse("batch|7-ab:3|-").unwrap().renewed_every_second());
        for bad in ["", "7-ab", "7-ab:x", "|7-ab:1", "a|7-ab:1|zz", "a|b|c|d", "a|:1|-"] {
            assert!(PermitId::parse(bad).is_err(), "{bad:?} parsed");
        }
        // The store's reading agrees with the typed one on every id this module makes.
        for id in [
            PermitId::new(None, &instance, 1, None),
            PermitId::new(Some("batch"), &instance, 2, None),
            PermitId::new(Some("batch"), &instance, 3, Some(TenantTag::of("t"))),
            old,
        ] {
            assert_eq!(text::class_of(id.as_str()), id.class());
            let tag = id.tenant().map_or(NO_TENANT.to_owned(), |t| t.to_string());
            assert_eq!(text::tenant_of(id.as_str()), tag);
            assert_eq!(text::renewed_every_second(id.as_str()), id.renewed_every_second());
        }
        assert_eq!((text::class_of("A"), text::tenant_of("A"), text::member_instance("b|7-ab")), (None, "-", "7-ab"));
        assert!(Instance::new("a|b").is_err() && Instance::new("").is_err() && Instance::new("a b").is_err());
    }
}
