//! PCC attach rules: the grammar of Lustre's `lctl pcc add` rules, parsed into an AST and
//! evaluated against the facts of one file.
//!
//! ```text
//! rule        := conjunction ( ',' conjunction )*        ',' is OR
//! conjunction := condition ( '&' condition )*            '&' is AND (binds tighter than ',')
//! condition   := FIELD OP '{' value ( WS value )* '}'
//! ```
//!
//! | field               | operators   | values                                                  |
//! |---------------------|-------------|---------------------------------------------------------|
//! | `uid` `gid` `projid`| `=` `<` `>` | decimal numbers; `=` takes a list (any matches), `<` `>` one |
//! | `fname`             | `=`         | shell globs (`*`, `?`, `[abc]`, `[a-z]`, `[!x]`, `\x`) on the base name |
//! | `size`              | `=` `<` `>` | one size; bare = MiB (as Lustre), suffix `K` `M` `G` `T` (any case, powers of 1024) |
//! | `mtime`             | `<` `>`     | one age; bare = seconds, suffix `s` `m` `h` `d` `w` `y` (365 d) |
//!
//! `mtime<{1h}` matches files modified less than an hour ago, `mtime>{7d}` files older than
//! seven days. Whitespace is allowed around every token. Example:
//! `projid={500 1000}&fname={*.h5},uid={1001}`.
//!
//! Errors carry the 0-based byte position of the offending token. The parser and the glob
//! matcher are iterative and linear (the matcher is O(pattern × name) at worst), so no input
//! can make them panic or blow the stack.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// What a rule is evaluated against.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FileFacts<'a> {
    pub uid: u32,
    pub gid: u32,
    pub projid: u32,
    /// The file's name; only the part after the last `/` is matched.
    pub name: &'a [u8],
    /// Size in bytes.
    pub size: u64,
    /// Last modification, nanoseconds since the epoch.
    pub mtime_ns: i64,
    /// The current time, nanoseconds since the epoch.
    pub now_ns: i64,
}

/// A rule field.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Field {
    Uid,
    Gid,
    Projid,
    Fname,
    Size,
    Mtime,
}

impl Field {
    fn from_name(s: &str) -> Option<Field> {
        Some(match s {
            "uid" => Field::Uid,
            "gid" => Field::Gid,
            "projid" => Field::Projid,
            "fname" => Field::Fname,
            "size" => Field::Size,
            "mtime" => Field::Mtime,
            _ => return None,
        })
    }

    /// The field's name as written in rules.
    pub fn name(self) -> &'static str {
        match self {
            Field::Uid => "uid",
            Field::Gid => "gid",
            Field::Projid => "projid",
            Field::Fname => "fname",
            Field::Size => "size",
            Field::Mtime => "mtime",
        }
    }

    /// Whether `op` (one of `=`, `<`, `>`) is valid for this field.
    pub fn allows(self, op: char) -> bool {
        match self {
            Field::Uid | Field::Gid | Field::Projid | Field::Size => matches!(op, '=' | '<' | '>'),
            Field::Fname => op == '=',
            Field::Mtime => matches!(op, '<' | '>'),
        }
    }

    fn operators_text(self) -> &'static str {
        match self {
            Field::Uid | Field::Gid | Field::Projid | Field::Size => "=, < or >",
            Field::Fname => "only =",
            Field::Mtime => "< or >",
        }
    }
}

impl fmt::Display for Field {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A comparison of a numeric id (uid, gid, projid).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum IdCmp {
    /// `=`: equal to any of the values (never empty).
    In(Vec<u32>),
    /// `<`
    Lt(u32),
    /// `>`
    Gt(u32),
}

impl IdCmp {
    fn matches(&self, v: u32) -> bool {
        match self {
            IdCmp::In(list) => list.contains(&v),
            IdCmp::Lt(x) => v < *x,
            IdCmp::Gt(x) => v > *x,
        }
    }
}

/// A comparison of the file size, in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SizeCmp {
    Eq(u64),
    Lt(u64),
    Gt(u64),
}

/// A comparison of the file's age (now − mtime), in seconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AgeCmp {
    /// `mtime<{age}`: modified less than `age` seconds ago (also true for mtimes in the future).
    Younger(u64),
    /// `mtime>{age}`: modified more than `age` seconds ago.
    Older(u64),
}

/// One `FIELD OP {VALUES}` condition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Condition {
    Uid(IdCmp),
    Gid(IdCmp),
    Projid(IdCmp),
    /// The base name matches any of the globs (never empty).
    Fname(Vec<Glob>),
    Size(SizeCmp),
    Mtime(AgeCmp),
}

impl Condition {
    /// The field this condition tests.
    pub fn field(&self) -> Field {
        match self {
            Condition::Uid(_) => Field::Uid,
            Condition::Gid(_) => Field::Gid,
            Condition::Projid(_) => Field::Projid,
            Condition::Fname(_) => Field::Fname,
            Condition::Size(_) => Field::Size,
            Condition::Mtime(_) => Field::Mtime,
        }
    }

    /// Evaluates the condition against one file.
    pub fn matches(&self, f: &FileFacts) -> bool {
        match self {
            Condition::Uid(c) => c.matches(f.uid),
            Condition::Gid(c) => c.matches(f.gid),
            Condition::Projid(c) => c.matches(f.projid),
            Condition::Fname(globs) => {
                let units = name_units(f.name);
                globs.iter().any(|g| g.matches_units(&units))
            }
            Condition::Size(SizeCmp::Eq(x)) => f.size == *x,
            Condition::Size(SizeCmp::Lt(x)) => f.size < *x,
            Condition::Size(SizeCmp::Gt(x)) => f.size > *x,
            Condition::Mtime(c) => {
                let age_ns = i128::from(f.now_ns) - i128::from(f.mtime_ns);
                match c {
                    AgeCmp::Younger(s) => age_ns < i128::from(*s) * 1_000_000_000,
                    AgeCmp::Older(s) => age_ns > i128::from(*s) * 1_000_000_000,
                }
            }
        }
    }
}

impl fmt::Display for Condition {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.field())?;
        match self {
            Condition::Uid(c) | Condition::Gid(c) | Condition::Projid(c) => match c {
                IdCmp::In(list) => {
                    f.write_str("={")?;
                    for (i, v) in list.iter().enumerate() {
                        if i > 0 {
                            f.write_str(" ")?;
                        }
                        write!(f, "{v}")?;
                    }
                    f.write_str("}")
                }
                IdCmp::Lt(v) => write!(f, "<{{{v}}}"),
                IdCmp::Gt(v) => write!(f, ">{{{v}}}"),
            },
            Condition::Fname(globs) => {
                f.write_str("={")?;
                for (i, g) in globs.iter().enumerate() {
                    if i > 0 {
                        f.write_str(" ")?;
                    }
                    write!(f, "{g}")?;
                }
                f.write_str("}")
            }
            Condition::Size(c) => {
                let (op, v) = match c {
                    SizeCmp::Eq(v) => ('=', *v),
                    SizeCmp::Lt(v) => ('<', *v),
                    SizeCmp::Gt(v) => ('>', *v),
                };
                write!(f, "{op}{{{}}}", size_text(v))
            }
            Condition::Mtime(c) => {
                let (op, v) = match c {
                    AgeCmp::Younger(v) => ('<', *v),
                    AgeCmp::Older(v) => ('>', *v),
                };
                write!(f, "{op}{{{}}}", age_text(v))
            }
        }
    }
}

const SIZE_UNITS: [(char, u64); 4] = [
    ('T', 1 << 40),
    ('G', 1 << 30),
    ('M', 1 << 20),
    ('K', 1 << 10),
];

const AGE_UNITS: [(char, u64); 6] = [
    ('y', 365 * 86_400),
    ('w', 7 * 86_400),
    ('d', 86_400),
    ('h', 3_600),
    ('m', 60),
    ('s', 1),
];

/// Canonical size text: the largest unit that divides it exactly (sizes parsed from rules
/// are always multiples of 1 KiB).
fn size_text(bytes: u64) -> String {
    if bytes == 0 {
        return "0".to_string();
    }
    for (suffix, mult) in SIZE_UNITS {
        if bytes / mult * mult == bytes {
            return format!("{}{suffix}", bytes / mult);
        }
    }
    // Unreachable: parsed sizes are whole KiB.
    format!("{}K", bytes / 1024)
}

fn age_text(secs: u64) -> String {
    if secs == 0 {
        return "0".to_string();
    }
    for (suffix, mult) in AGE_UNITS {
        if secs / mult * mult == secs {
            return format!("{}{suffix}", secs / mult);
        }
    }
    format!("{secs}s")
}

// ---------------------------------------------------------------------------------------------
// Globs
// ---------------------------------------------------------------------------------------------

/// Name units above this value stand for bytes that are not valid UTF-8 (never a `char`).
const INVALID_BYTE_BASE: u32 = 0x11_0000;

#[derive(Debug, Clone, PartialEq, Eq)]
enum Tok {
    Lit(char),
    Any,
    Star,
    Class {
        negated: bool,
        ranges: Vec<(char, char)>,
    },
}

impl Tok {
    fn matches_one(&self, unit: u32) -> bool {
        match self {
            Tok::Lit(c) => *c as u32 == unit,
            Tok::Any => true,
            Tok::Star => false,
            Tok::Class { negated, ranges } => {
                let inside = char::from_u32(unit)
                    .is_some_and(|c| ranges.iter().any(|&(lo, hi)| lo <= c && c <= hi));
                inside != *negated
            }
        }
    }
}

/// A compiled shell glob (`*`, `?`, `[...]` classes with ranges and `!`/`^` negation,
/// backslash escapes). Equality is on the compiled form, so `a**` equals `a*`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Glob {
    toks: Vec<Tok>,
}

impl Glob {
    /// Compiles a glob; the error is (byte offset in `pat`, reason).
    fn compile(pat: &str) -> Result<Glob, (usize, String)> {
        let mut toks = Vec::new();
        let mut it = pat.char_indices().peekable();
        while let Some((i, c)) = it.next() {
            let tok = match c {
                '*' => {
                    if toks.last() == Some(&Tok::Star) {
                        continue;
                    }
                    Tok::Star
                }
                '?' => Tok::Any,
                '\\' => match it.next() {
                    Some((_, e)) => Tok::Lit(e),
                    None => return Err((i, "trailing '\\' escapes nothing".to_string())),
                },
                '[' => {
                    let mut negated = false;
                    if let Some(&(_, '!' | '^')) = it.peek() {
                        negated = true;
                        it.next();
                    }
                    let mut ranges: Vec<(char, char)> = Vec::new();
                    let mut first = true;
                    loop {
                        let Some((j, c)) = it.next() else {
                            return Err((i, "'[' class is not closed with ']'".to_string()));
                        };
                        let lo = match c {
                            ']' if !first => break,
                            '\\' => match it.next() {
                                Some((_, e)) => e,
                                None => {
                                    return Err((i, "'[' class is not closed with ']'".to_string()))
                                }
                            },
                            c => c,
                        };
                        first = false;
                        let mut hi = lo;
                        if let Some(&(_, '-')) = it.peek() {
                            let mut look = it.clone();
                            look.next();
                            match look.next() {
                                Some((_, ']')) | None => {}
                                Some((_, h)) => {
                                    it = look;
                                    hi = if h == '\\' {
                                        match it.next() {
                                            Some((_, e)) => e,
                                            None => {
                                                return Err((
                                                    i,
                                                    "'[' class is not closed with ']'".to_string(),
                                                ))
                                            }
                                        }
                                    } else {
                                        h
                                    };
                                    if hi < lo {
                                        return Err((j, format!("range '{lo}-{hi}' is reversed")));
                                    }
                                }
                            }
                        }
                        ranges.push((lo, hi));
                    }
                    Tok::Class { negated, ranges }
                }
                c => Tok::Lit(c),
            };
            if tok == Tok::Lit('/') {
                return Err((i, "'/' never occurs in a base name".to_string()));
            }
            toks.push(tok);
        }
        Ok(Glob { toks })
    }

    /// Whether `name` (its part after the last `/`) matches.
    pub fn matches(&self, name: &[u8]) -> bool {
        self.matches_units(&name_units(name))
    }

    fn matches_units(&self, name: &[u32]) -> bool {
        let toks = &self.toks;
        let (mut p, mut n) = (0usize, 0usize);
        // Position after the last '*' and the name position it currently absorbs up to.
        let mut star: Option<(usize, usize)> = None;
        while n < name.len() {
            if let Some(t) = toks.get(p) {
                if *t == Tok::Star {
                    star = Some((p + 1, n));
                    p += 1;
                    continue;
                }
                if t.matches_one(name[n]) {
                    p += 1;
                    n += 1;
                    continue;
                }
            }
            match star {
                Some((sp, sn)) => {
                    p = sp;
                    n = sn + 1;
                    star = Some((sp, sn + 1));
                }
                None => return false,
            }
        }
        toks[p.min(toks.len())..].iter().all(|t| *t == Tok::Star)
    }
}

fn escape_lit(out: &mut String, c: char, specials: &[char]) {
    if c.is_ascii_whitespace() || specials.contains(&c) {
        out.push('\\');
    }
    out.push(c);
}

impl fmt::Display for Glob {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const OUTSIDE: &[char] = &['\\', '*', '?', '[', ']', '{', '}'];
        const INSIDE: &[char] = &['\\', ']', '[', '-', '!', '^', '{', '}'];
        let mut s = String::new();
        for t in &self.toks {
            match t {
                Tok::Lit(c) => escape_lit(&mut s, *c, OUTSIDE),
                Tok::Any => s.push('?'),
                Tok::Star => s.push('*'),
                Tok::Class { negated, ranges } => {
                    s.push('[');
                    if *negated {
                        s.push('!');
                    }
                    for &(lo, hi) in ranges {
                        escape_lit(&mut s, lo, INSIDE);
                        if hi != lo {
                            s.push('-');
                            escape_lit(&mut s, hi, INSIDE);
                        }
                    }
                    s.push(']');
                }
            }
        }
        f.write_str(&s)
    }
}

/// The base name as match units: chars of valid UTF-8, invalid bytes as values above
/// `char::MAX` (matched only by `?`, `*` and negated classes).
fn name_units(name: &[u8]) -> Vec<u32> {
    let base = match name.iter().rposition(|&b| b == b'/') {
        Some(i) => &name[i + 1..],
        None => name,
    };
    let mut out = Vec::with_capacity(base.len());
    for chunk in base.utf8_chunks() {
        out.extend(chunk.valid().chars().map(|c| c as u32));
        out.extend(
            chunk
                .invalid()
                .iter()
                .map(|&b| INVALID_BYTE_BASE + u32::from(b)),
        );
    }
    out
}

// ---------------------------------------------------------------------------------------------
// Errors
// ---------------------------------------------------------------------------------------------

fn describe(c: &Option<char>) -> String {
    match c {
        Some(c) => quote(c),
        None => "end of rule".to_string(),
    }
}

fn quote(c: &char) -> String {
    format!("'{}'", c.escape_debug())
}

/// A malformed rule: every variant carries the 0-based byte position it refers to.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RuleError {
    #[error("position {pos}: expected a condition (FIELD OP {{VALUES}}, e.g. uid={{1000}}), found {}", describe(.found))]
    ExpectedCondition { pos: usize, found: Option<char> },
    #[error(
        "position {pos}: unknown field '{field}' (expected uid, gid, projid, fname, size or mtime)"
    )]
    UnknownField { pos: usize, field: String },
    #[error("position {pos}: expected an operator (=, < or >) after '{field}', found {}", describe(.found))]
    ExpectedOperator {
        pos: usize,
        field: Field,
        found: Option<char>,
    },
    #[error("position {pos}: unknown operator '{op}' (expected =, < or >)")]
    UnknownOperator { pos: usize, op: String },
    #[error("position {pos}: operator '{op}' is not valid for {field} (it takes {})", .field.operators_text())]
    WrongOperator { pos: usize, field: Field, op: char },
    #[error("position {pos}: expected '{{' to start the values, found {}", describe(.found))]
    ExpectedOpenBrace { pos: usize, found: Option<char> },
    #[error("position {pos}: '{{' is not closed with '}}'")]
    UnterminatedBrace { pos: usize },
    #[error(
        "position {pos}: '{{' inside a value list (the '{{' at position {open} is not closed)"
    )]
    NestedBrace { pos: usize, open: usize },
    #[error("position {pos}: empty value list")]
    EmptyValues { pos: usize },
    #[error("position {pos}: {field}{op} takes a single value")]
    TooManyValues { pos: usize, field: Field, op: char },
    #[error("position {pos}: bad number '{}': {reason}", .value.escape_debug())]
    BadNumber {
        pos: usize,
        value: String,
        reason: String,
    },
    #[error("position {pos}: bad glob '{}': {reason}", .pattern.escape_debug())]
    BadGlob {
        pos: usize,
        pattern: String,
        reason: String,
    },
    #[error("position {pos}: unexpected {} (expected '&', ',' or end of rule)", quote(.found))]
    UnexpectedChar { pos: usize, found: char },
}

impl RuleError {
    /// The 0-based byte position in the rule text.
    pub fn position(&self) -> usize {
        match self {
            RuleError::ExpectedCondition { pos, .. }
            | RuleError::UnknownField { pos, .. }
            | RuleError::ExpectedOperator { pos, .. }
            | RuleError::UnknownOperator { pos, .. }
            | RuleError::WrongOperator { pos, .. }
            | RuleError::ExpectedOpenBrace { pos, .. }
            | RuleError::UnterminatedBrace { pos }
            | RuleError::NestedBrace { pos, .. }
            | RuleError::EmptyValues { pos }
            | RuleError::TooManyValues { pos, .. }
            | RuleError::BadNumber { pos, .. }
            | RuleError::BadGlob { pos, .. }
            | RuleError::UnexpectedChar { pos, .. } => *pos,
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Parser
// ---------------------------------------------------------------------------------------------

struct Parser<'s> {
    s: &'s str,
    pos: usize,
}

impl<'s> Parser<'s> {
    fn peek(&self) -> Option<char> {
        self.s[self.pos..].chars().next()
    }

    fn bump(&mut self) -> Option<char> {
        let c = self.peek()?;
        self.pos += c.len_utf8();
        Some(c)
    }

    fn skip_ws(&mut self) {
        while self.peek().is_some_and(|c| c.is_ascii_whitespace()) {
            self.pos += 1;
        }
    }

    fn rule(&mut self) -> Result<Rule, RuleError> {
        let mut alternatives = Vec::new();
        loop {
            let mut all = Vec::new();
            loop {
                all.push(self.condition()?);
                self.skip_ws();
                if self.peek() == Some('&') {
                    self.pos += 1;
                } else {
                    break;
                }
            }
            alternatives.push(all);
            match self.peek() {
                Some(',') => self.pos += 1,
                None => break,
                Some(c) => {
                    return Err(RuleError::UnexpectedChar {
                        pos: self.pos,
                        found: c,
                    })
                }
            }
        }
        Ok(Rule { alternatives })
    }

    fn condition(&mut self) -> Result<Condition, RuleError> {
        self.skip_ws();
        let start = self.pos;
        match self.peek() {
            Some(c) if c.is_ascii_alphabetic() => {}
            found => return Err(RuleError::ExpectedCondition { pos: start, found }),
        }
        while self
            .peek()
            .is_some_and(|c| c.is_ascii_alphanumeric() || c == '_')
        {
            self.pos += 1;
        }
        let name = &self.s[start..self.pos];
        let field = Field::from_name(name).ok_or_else(|| RuleError::UnknownField {
            pos: start,
            field: name.to_string(),
        })?;

        self.skip_ws();
        let op_pos = self.pos;
        while self.peek().is_some_and(|c| "=<>!".contains(c)) {
            self.pos += 1;
        }
        let op_text = &self.s[op_pos..self.pos];
        let op = match op_text {
            "" => {
                return Err(RuleError::ExpectedOperator {
                    pos: op_pos,
                    field,
                    found: self.peek(),
                })
            }
            "=" | "<" | ">" => op_text.chars().next().unwrap_or('='),
            _ => {
                return Err(RuleError::UnknownOperator {
                    pos: op_pos,
                    op: op_text.to_string(),
                })
            }
        };
        if !field.allows(op) {
            return Err(RuleError::WrongOperator {
                pos: op_pos,
                field,
                op,
            });
        }

        self.skip_ws();
        let open = self.pos;
        if self.peek() != Some('{') {
            return Err(RuleError::ExpectedOpenBrace {
                pos: open,
                found: self.peek(),
            });
        }
        self.pos += 1;
        let values = self.values(open)?;
        let single = |values: &[(usize, &'s str)]| single_value(values, field, op);

        Ok(match field {
            Field::Uid | Field::Gid | Field::Projid => {
                let cmp = if op == '=' {
                    let mut list = Vec::with_capacity(values.len());
                    for &(pos, v) in &values {
                        list.push(parse_id(pos, v)?);
                    }
                    IdCmp::In(list)
                } else {
                    let (pos, v) = single(&values)?;
                    let n = parse_id(pos, v)?;
                    if op == '<' {
                        IdCmp::Lt(n)
                    } else {
                        IdCmp::Gt(n)
                    }
                };
                match field {
                    Field::Uid => Condition::Uid(cmp),
                    Field::Gid => Condition::Gid(cmp),
                    _ => Condition::Projid(cmp),
                }
            }
            Field::Fname => {
                let mut globs = Vec::with_capacity(values.len());
                for &(pos, v) in &values {
                    let g = Glob::compile(v).map_err(|(off, reason)| RuleError::BadGlob {
                        pos: pos + off,
                        pattern: v.to_string(),
                        reason,
                    })?;
                    globs.push(g);
                }
                Condition::Fname(globs)
            }
            Field::Size => {
                let (pos, v) = single(&values)?;
                let n = parse_size(pos, v)?;
                Condition::Size(match op {
                    '=' => SizeCmp::Eq(n),
                    '<' => SizeCmp::Lt(n),
                    _ => SizeCmp::Gt(n),
                })
            }
            Field::Mtime => {
                let (pos, v) = single(&values)?;
                let n = parse_age(pos, v)?;
                Condition::Mtime(if op == '<' {
                    AgeCmp::Younger(n)
                } else {
                    AgeCmp::Older(n)
                })
            }
        })
    }

    /// Reads values up to and including the closing `}` (the `{` at `open` is consumed).
    fn values(&mut self, open: usize) -> Result<Vec<(usize, &'s str)>, RuleError> {
        let mut values = Vec::new();
        loop {
            self.skip_ws();
            match self.peek() {
                None => return Err(RuleError::UnterminatedBrace { pos: open }),
                Some('}') => {
                    self.pos += 1;
                    break;
                }
                Some(_) => {}
            }
            let start = self.pos;
            loop {
                match self.peek() {
                    None | Some('}') => break,
                    Some(c) if c.is_ascii_whitespace() => break,
                    Some('{') => {
                        return Err(RuleError::NestedBrace {
                            pos: self.pos,
                            open,
                        })
                    }
                    Some('\\') => {
                        self.pos += 1;
                        if self.bump().is_none() {
                            return Err(RuleError::UnterminatedBrace { pos: open });
                        }
                    }
                    Some(_) => {
                        self.bump();
                    }
                }
            }
            values.push((start, &self.s[start..self.pos]));
        }
        if values.is_empty() {
            return Err(RuleError::EmptyValues { pos: open });
        }
        Ok(values)
    }
}

/// The only value of `values` (which is never empty).
fn single_value<'v>(
    values: &[(usize, &'v str)],
    field: Field,
    op: char,
) -> Result<(usize, &'v str), RuleError> {
    match values {
        [one] => Ok(*one),
        [_, (pos, _), ..] => Err(RuleError::TooManyValues {
            pos: *pos,
            field,
            op,
        }),
        [] => Err(RuleError::EmptyValues { pos: 0 }),
    }
}

fn bad_number(pos: usize, value: &str, reason: impl Into<String>) -> RuleError {
    RuleError::BadNumber {
        pos,
        value: value.to_string(),
        reason: reason.into(),
    }
}

/// Splits `v` into its leading ASCII digits (parsed as u64) and the rest.
fn leading_number(pos: usize, v: &str) -> Result<(u64, &str), RuleError> {
    let digits = v.bytes().take_while(u8::is_ascii_digit).count();
    if digits == 0 {
        return Err(bad_number(pos, v, "expected a decimal number"));
    }
    let mut n: u64 = 0;
    for b in v[..digits].bytes() {
        n = n
            .checked_mul(10)
            .and_then(|n| n.checked_add(u64::from(b - b'0')))
            .ok_or_else(|| bad_number(pos, v, "too large"))?;
    }
    Ok((n, &v[digits..]))
}

fn parse_id(pos: usize, v: &str) -> Result<u32, RuleError> {
    let (n, rest) = leading_number(pos, v)?;
    if !rest.is_empty() {
        return Err(bad_number(
            pos + (v.len() - rest.len()),
            v,
            "expected a decimal number",
        ));
    }
    u32::try_from(n).map_err(|_| bad_number(pos, v, "too large (at most 4294967295)"))
}

fn parse_size(pos: usize, v: &str) -> Result<u64, RuleError> {
    const HINT: &str = "expected K, M, G or T; bare numbers are MiB";
    let unit = |c: char| {
        let c = c.to_ascii_uppercase();
        SIZE_UNITS.iter().find(|(s, _)| *s == c).map(|&(_, m)| m)
    };
    parse_scaled(pos, v, 1 << 20, unit, "size", HINT)
}

fn parse_age(pos: usize, v: &str) -> Result<u64, RuleError> {
    const HINT: &str = "expected s, m, h, d, w or y; bare numbers are seconds";
    let unit = |c: char| AGE_UNITS.iter().find(|(s, _)| *s == c).map(|&(_, m)| m);
    parse_scaled(pos, v, 1, unit, "time", HINT)
}

/// A number with an optional one-letter unit suffix (`bare` is the multiplier without one).
fn parse_scaled(
    pos: usize,
    v: &str,
    bare: u64,
    unit: impl Fn(char) -> Option<u64>,
    what: &str,
    hint: &str,
) -> Result<u64, RuleError> {
    let (n, rest) = leading_number(pos, v)?;
    let mut chars = rest.chars();
    let mult = match (chars.next(), chars.next()) {
        (None, _) => bare,
        (Some(c), None) if unit(c).is_some() => unit(c).unwrap_or(bare),
        _ => {
            let suffix_pos = pos + (v.len() - rest.len());
            let reason = format!("unknown {what} suffix '{}' ({hint})", rest.escape_debug());
            return Err(bad_number(suffix_pos, v, reason));
        }
    };
    n.checked_mul(mult)
        .ok_or_else(|| bad_number(pos, v, "too large (over 2^64)"))
}

// ---------------------------------------------------------------------------------------------
// Rule
// ---------------------------------------------------------------------------------------------

/// A parsed attach rule: an OR (`,`) of ANDs (`&`) of conditions. Serialized as its
/// canonical text (and validated again when deserialized).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct Rule {
    /// Never empty, and no inner list is empty.
    alternatives: Vec<Vec<Condition>>,
}

impl Rule {
    /// Parses a rule; on error, the position and reason of the first problem.
    pub fn parse(s: &str) -> Result<Rule, RuleError> {
        Parser { s, pos: 0 }.rule()
    }

    /// The canonical text: no whitespace, values separated by one space, sizes and ages in
    /// the largest exact unit. `Rule::parse(&r.text()) == Ok(r)`.
    pub fn text(&self) -> String {
        self.to_string()
    }

    /// The conditions: the rule matches when all conditions of any one alternative match.
    pub fn alternatives(&self) -> &[Vec<Condition>] {
        &self.alternatives
    }

    /// Whether the rule selects this file.
    pub fn matches(&self, f: &FileFacts) -> bool {
        self.alternatives
            .iter()
            .any(|all| all.iter().all(|c| c.matches(f)))
    }
}

impl fmt::Display for Rule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, all) in self.alternatives.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            for (j, c) in all.iter().enumerate() {
                if j > 0 {
                    f.write_str("&")?;
                }
                write!(f, "{c}")?;
            }
        }
        Ok(())
    }
}

impl FromStr for Rule {
    type Err = RuleError;
    fn from_str(s: &str) -> Result<Rule, RuleError> {
        Rule::parse(s)
    }
}

impl TryFrom<String> for Rule {
    type Error = RuleError;
    fn try_from(s: String) -> Result<Rule, RuleError> {
        Rule::parse(&s)
    }
}

impl From<Rule> for String {
    fn from(r: Rule) -> String {
        r.text()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const NOW: i64 = 1_700_000_000 * 1_000_000_000;
    const SEC: i64 = 1_000_000_000;

    fn facts(name: &str) -> FileFacts<'_> {
        FileFacts {
            uid: 1000,
            gid: 100,
            projid: 0,
            name: name.as_bytes(),
            size: 0,
            mtime_ns: NOW,
            now_ns: NOW,
        }
    }

    fn err(s: &str) -> RuleError {
        Rule::parse(s).expect_err(s)
    }

    fn m(rule: &str, f: &FileFacts) -> bool {
        Rule::parse(rule).unwrap().matches(f)
    }

    #[test]
    fn lustre_example() {
        let r: Rule = "projid={500 1000}&fname={*.h5},uid={1001}".parse().unwrap();
        assert_eq!(r.text(), "projid={500 1000}&fname={*.h5},uid={1001}");
        assert_eq!(r.alternatives().len(), 2);
        assert_eq!(r.alternatives()[0].len(), 2);
        let mut f = facts("run.h5");
        f.projid = 500;
        assert!(r.matches(&f));
        f.projid = 1000;
        assert!(r.matches(&f));
        f.projid = 501;
        assert!(!r.matches(&f));
        f.uid = 1001;
        assert!(r.matches(&f));
        f.uid = 1000;
        f.projid = 500;
        f.name = b"run.h6";
        assert!(!r.matches(&f));
    }

    #[test]
    fn ids_all_operators() {
        let mut f = facts("x");
        f.uid = 10;
        f.gid = 20;
        f.projid = 30;
        assert!(m("uid={10}", &f));
        assert!(m("uid={1 2 10}", &f));
        assert!(!m("uid={1 2 3}", &f));
        assert!(m("uid<{11}", &f));
        assert!(!m("uid<{10}", &f));
        assert!(m("uid>{9}", &f));
        assert!(!m("uid>{10}", &f));
        assert!(m("gid={20}", &f) && !m("gid={10}", &f));
        assert!(m("gid<{21}", &f) && !m("gid<{20}", &f));
        assert!(m("gid>{19}", &f) && !m("gid>{20}", &f));
        assert!(m("projid={30 40}", &f) && !m("projid={10}", &f));
        assert!(m("projid<{31}", &f) && !m("projid<{30}", &f));
        assert!(m("projid>{29}", &f) && !m("projid>{30}", &f));
        assert!(m("uid={4294967295 10}", &f));
    }

    #[test]
    fn and_binds_tighter_than_or() {
        // a&b,c == (a&b),c
        let r = Rule::parse("uid={1}&gid={2},projid={3}").unwrap();
        let mut f = facts("x");
        f.uid = 1;
        f.gid = 2;
        assert!(r.matches(&f));
        f.gid = 9;
        assert!(!r.matches(&f));
        f.projid = 3;
        assert!(r.matches(&f));
        // a,b&c == a,(b&c)
        let r = Rule::parse("uid={1},gid={2}&projid={3}").unwrap();
        let mut f = facts("x");
        f.uid = 1;
        assert!(r.matches(&f));
        f.uid = 0;
        f.gid = 2;
        assert!(!r.matches(&f));
        f.projid = 3;
        assert!(r.matches(&f));
        assert_eq!(r.alternatives()[0].len(), 1);
        assert_eq!(r.alternatives()[1].len(), 2);
    }

    #[test]
    fn whitespace_everywhere() {
        let r =
            Rule::parse("  projid = { 500   1000 } & fname ={ *.h5\t}\n,\tuid= {1001}  ").unwrap();
        assert_eq!(r.text(), "projid={500 1000}&fname={*.h5},uid={1001}");
    }

    #[test]
    fn fname_globs() {
        let f = |name: &'static str| facts(name);
        assert!(m("fname={*.h5}", &f("a.h5")));
        assert!(m("fname={*.h5}", &f(".h5")));
        assert!(!m("fname={*.h5}", &f("a.h5x")));
        assert!(m("fname={*.txt *.h5}", &f("a.h5")));
        assert!(m("fname={data?.bin}", &f("data1.bin")));
        assert!(!m("fname={data?.bin}", &f("data.bin")));
        assert!(!m("fname={data?.bin}", &f("data12.bin")));
        assert!(m("fname={*}", &f("")));
        assert!(m("fname={a*b*c}", &f("aXXbYYbc")));
        assert!(!m("fname={a*b*c}", &f("aXXbYYb")));
        assert!(m("fname={exact}", &f("exact")));
        assert!(!m("fname={exact}", &f("exactly")));
        // base name only
        assert!(m("fname={*.h5}", &f("dir/sub/a.h5")));
        assert!(!m("fname={dir*}", &f("dir/sub/a.h5")));
        // pathological backtracking stays fast
        let long = "a".repeat(5000);
        let lf = FileFacts {
            name: long.as_bytes(),
            ..facts("")
        };
        assert!(!m("fname={*a*a*a*a*a*a*a*a*b}", &lf));
    }

    #[test]
    fn glob_classes() {
        let f = |name: &'static str| facts(name);
        assert!(m("fname={file[0-9].dat}", &f("file7.dat")));
        assert!(!m("fname={file[0-9].dat}", &f("fileA.dat")));
        assert!(m("fname={file[!0-9].dat}", &f("fileA.dat")));
        assert!(m("fname={file[^0-9].dat}", &f("fileA.dat")));
        assert!(!m("fname={file[!0-9].dat}", &f("file1.dat")));
        assert!(m("fname={[abc]x}", &f("bx")));
        assert!(!m("fname={[abc]x}", &f("dx")));
        assert!(m("fname={[a-cx-z]}", &f("y")));
        assert!(m("fname={[]]}", &f("]")));
        assert!(m("fname={[a-]}", &f("-")));
        assert!(m("fname={[\\]]}", &f("]")));
        assert!(m("fname={\\*}", &f("*")));
        assert!(!m("fname={\\*}", &f("a")));
        assert!(m("fname={a\\ b}", &f("a b")));
        assert!(m("fname={é?}", &f("éü")));
        // invalid UTF-8: only wildcards and negated classes match those bytes
        let bad = FileFacts {
            name: b"x\xff.h5",
            ..facts("")
        };
        assert!(m("fname={x?.h5}", &bad));
        assert!(m("fname={*.h5}", &bad));
        assert!(m("fname={x[!a].h5}", &bad));
        assert!(!m("fname={x[a-z].h5}", &bad));
        // canonical text of globs
        assert_eq!(
            Rule::parse("fname={a**b [^x] [\\]a-] \\a}").unwrap().text(),
            "fname={a*b [!x] [\\]a\\-] a}"
        );
    }

    #[test]
    fn sizes() {
        let mib = 1u64 << 20;
        let mut f = facts("x");
        f.size = 5 * mib;
        assert!(m("size={5}", &f));
        assert!(m("size={5M}", &f));
        assert!(m("size={5m}", &f));
        assert!(m("size={5120k}", &f));
        assert!(m("size={5120K}", &f));
        assert!(!m("size={5G}", &f));
        assert!(m("size<{6}", &f) && !m("size<{5}", &f));
        assert!(m("size>{4}", &f) && !m("size>{5}", &f));
        f.size = 3 << 30;
        assert!(m("size={3g}", &f) && m("size={3G}", &f));
        f.size = 2 << 40;
        assert!(m("size={2T}", &f) && m("size={2t}", &f) && m("size={2048G}", &f));
        assert_eq!(Rule::parse("size>{1024}").unwrap().text(), "size>{1G}");
        assert_eq!(Rule::parse("size>{1536K}").unwrap().text(), "size>{1536K}");
        assert_eq!(Rule::parse("size<{0}").unwrap().text(), "size<{0}");
        assert_eq!(
            Rule::parse("size<{1}").unwrap().alternatives()[0][0],
            Condition::Size(SizeCmp::Lt(mib))
        );
    }

    #[test]
    fn mtime_ages() {
        let mut f = facts("x");
        f.mtime_ns = NOW - 30 * 60 * SEC; // 30 minutes ago
        assert!(m("mtime<{1h}", &f));
        assert!(!m("mtime>{1h}", &f));
        assert!(m("mtime>{29m}", &f));
        assert!(m("mtime<{1801}", &f) && m("mtime<{1801s}", &f));
        assert!(!m("mtime<{1800}", &f) && !m("mtime>{1800}", &f));
        f.mtime_ns = NOW - 8 * 86_400 * SEC;
        assert!(m("mtime>{7d}", &f) && m("mtime>{1w}", &f));
        assert!(!m("mtime>{2w}", &f) && m("mtime<{2w}", &f));
        assert!(m("mtime<{1y}", &f) && !m("mtime>{1y}", &f));
        f.mtime_ns = NOW - 400 * 86_400 * SEC;
        assert!(m("mtime>{1y}", &f));
        // from the future: age negative, "younger than" anything
        f.mtime_ns = NOW + 10 * SEC;
        assert!(m("mtime<{0}", &f) && !m("mtime>{0}", &f));
        // extremes do not overflow
        f.mtime_ns = i64::MIN;
        f.now_ns = i64::MAX;
        assert!(m("mtime>{1y}", &f));
        assert!(m("mtime<{18446744073709551615}", &f));
        assert_eq!(Rule::parse("mtime<{3600}").unwrap().text(), "mtime<{1h}");
        assert_eq!(Rule::parse("mtime>{14d}").unwrap().text(), "mtime>{2w}");
        assert_eq!(Rule::parse("mtime>{90s}").unwrap().text(), "mtime>{90s}");
        assert_eq!(
            Rule::parse("mtime>{1d}").unwrap().alternatives()[0][0],
            Condition::Mtime(AgeCmp::Older(86_400))
        );
    }

    #[test]
    fn serde_is_the_text() {
        use serde::de::IntoDeserializer;
        let de: serde::de::value::StringDeserializer<serde::de::value::Error> =
            "uid = {1 2} & size>{1G}".to_string().into_deserializer();
        let r = Rule::deserialize(de).unwrap();
        assert_eq!(String::from(r.clone()), "uid={1 2}&size>{1G}");
        let de: serde::de::value::StringDeserializer<serde::de::value::Error> =
            "uid={".to_string().into_deserializer();
        let e = Rule::deserialize(de).unwrap_err();
        assert!(e.to_string().contains("position 4"), "{e}");
    }

    #[test]
    fn error_kinds_and_positions() {
        let cases: &[(&str, usize, &str)] = &[
            ("", 0, "expected a condition"),
            ("uid={1},", 8, "found end of rule"),
            ("uid={1}&&gid={2}", 8, "found '&'"),
            ("   , uid={1}", 3, "found ','"),
            ("uid={1}&gid={2},foo={3}", 16, "unknown field 'foo'"),
            ("uid", 3, "expected an operator"),
            ("uid {1}", 4, "expected an operator"),
            ("uid<={1}", 3, "unknown operator '<='"),
            ("uid!={1}", 3, "unknown operator '!='"),
            ("fname<{a}", 5, "operator '<' is not valid for fname"),
            ("mtime={1h}", 5, "operator '=' is not valid for mtime"),
            ("uid=1", 4, "expected '{'"),
            ("uid=", 4, "found end of rule"),
            ("uid={1 2", 4, "not closed"),
            ("fname={a\\", 6, "not closed"),
            ("uid={1,gid={2}", 11, "the '{' at position 4"),
            ("uid={}", 4, "empty value list"),
            ("uid={   }", 4, "empty value list"),
            ("uid<{1 2}", 7, "uid< takes a single value"),
            ("size={1 2}", 8, "size= takes a single value"),
            ("mtime>{1d 2d}", 10, "mtime> takes a single value"),
            ("uid={1 x}", 7, "bad number 'x'"),
            ("uid={12a}", 7, "bad number '12a'"),
            ("uid={-1}", 5, "bad number '-1'"),
            ("uid={4294967296}", 5, "too large"),
            ("size={1X}", 7, "unknown size suffix 'X'"),
            ("size={1KB}", 7, "unknown size suffix 'KB'"),
            ("size={99999999T}", 6, "too large"),
            ("size={99999999999999999999}", 6, "too large"),
            ("mtime<{5q}", 8, "unknown time suffix 'q'"),
            ("mtime<{5H}", 8, "unknown time suffix 'H'"),
            ("mtime<{h}", 7, "expected a decimal number"),
            ("fname={ab[cd}", 9, "'[' class is not closed"),
            ("fname={[z-a]}", 8, "reversed"),
            ("fname={a/b}", 8, "'/' never occurs"),
            ("uid={1} gid={2}", 8, "unexpected 'g'"),
            ("uid={1}}", 7, "unexpected '}'"),
        ];
        for &(input, pos, text) in cases {
            let e = err(input);
            assert_eq!(e.position(), pos, "{input:?}: {e}");
            let msg = e.to_string();
            assert!(msg.starts_with(&format!("position {pos}: ")), "{msg}");
            assert!(msg.contains(text), "{input:?}: {msg}");
        }
        assert_eq!(
            err("uid={1}&gid={2},foo={3}").to_string(),
            "position 16: unknown field 'foo' (expected uid, gid, projid, fname, size or mtime)"
        );
        assert!(matches!(err("uid={}"), RuleError::EmptyValues { pos: 4 }));
        assert!(matches!(
            err("fname>{x}"),
            RuleError::WrongOperator {
                field: Field::Fname,
                op: '>',
                ..
            }
        ));
        // positions are byte offsets, also after multi-byte characters
        assert_eq!(err("fname={é}&éuid={1}").position(), 11);
    }

    fn id_cmp() -> impl Strategy<Value = IdCmp> {
        prop_oneof![
            prop::collection::vec(any::<u32>(), 1..4).prop_map(IdCmp::In),
            any::<u32>().prop_map(IdCmp::Lt),
            any::<u32>().prop_map(IdCmp::Gt),
        ]
    }

    fn lit_char() -> impl Strategy<Value = char> {
        prop_oneof![
            prop::sample::select(vec![
                'a', 'Z', '.', '_', '-', ' ', '\t', '*', '?', '[', ']', '{', '}', '\\', ',', '&',
                '!', '^', '=', 'é',
            ]),
            any::<char>(),
        ]
        .prop_filter("no slash", |c| *c != '/')
    }

    fn glob() -> impl Strategy<Value = Glob> {
        let tok = prop_oneof![
            3 => lit_char().prop_map(Tok::Lit),
            1 => Just(Tok::Any),
            1 => Just(Tok::Star),
            1 => (
                any::<bool>(),
                prop::collection::vec((lit_char(), lit_char()), 1..3)
            )
                .prop_map(|(negated, rs)| Tok::Class {
                    negated,
                    ranges: rs
                        .into_iter()
                        .map(|(a, b)| if a <= b { (a, b) } else { (b, a) })
                        .collect(),
                }),
        ];
        prop::collection::vec(tok, 1..6).prop_map(|toks| {
            let mut out: Vec<Tok> = Vec::new();
            for t in toks {
                if !(t == Tok::Star && out.last() == Some(&Tok::Star)) {
                    out.push(t);
                }
            }
            Glob { toks: out }
        })
    }

    fn condition() -> impl Strategy<Value = Condition> {
        let size = (0u64..100_000, 0usize..4).prop_map(|(n, u)| n * SIZE_UNITS[u].1);
        let age = (0u64..100_000, 0usize..6).prop_map(|(n, u)| n * AGE_UNITS[u].1);
        prop_oneof![
            id_cmp().prop_map(Condition::Uid),
            id_cmp().prop_map(Condition::Gid),
            id_cmp().prop_map(Condition::Projid),
            prop::collection::vec(glob(), 1..4).prop_map(Condition::Fname),
            (0..3u8, size).prop_map(|(op, n)| Condition::Size(match op {
                0 => SizeCmp::Eq(n),
                1 => SizeCmp::Lt(n),
                _ => SizeCmp::Gt(n),
            })),
            (any::<bool>(), age).prop_map(|(y, n)| Condition::Mtime(if y {
                AgeCmp::Younger(n)
            } else {
                AgeCmp::Older(n)
            })),
        ]
    }

    fn rule() -> impl Strategy<Value = Rule> {
        prop::collection::vec(prop::collection::vec(condition(), 1..4), 1..4)
            .prop_map(|alternatives| Rule { alternatives })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]

        #[test]
        fn canonical_text_round_trips(r in rule()) {
            let text = r.text();
            prop_assert_eq!(Rule::parse(&text), Ok(r), "{}", text);
        }

        #[test]
        fn arbitrary_strings_never_panic(s in any::<String>()) {
            if let Ok(r) = Rule::parse(&s) {
                prop_assert_eq!(Rule::parse(&r.text()), Ok(r));
            }
        }

        #[test]
        fn grammar_like_strings_never_panic(
            s in "[ugidprojfnamesztQ=<>!{}&,*?\\[\\]\\\\^/0-9KMGTkhdwy é\t-]{0,40}"
        ) {
            match Rule::parse(&s) {
                Ok(r) => {
                    let f = facts("abc.h5");
                    let _ = r.matches(&f);
                    prop_assert_eq!(Rule::parse(&r.text()), Ok(r));
                }
                Err(e) => prop_assert!(e.position() <= s.len()),
            }
        }

        #[test]
        fn matching_never_panics(r in rule(), name in prop::collection::vec(any::<u8>(), 0..20),
                                 size in any::<u64>(), mtime in any::<i64>(), now in any::<i64>()) {
            let f = FileFacts { uid: 1, gid: 2, projid: 3, name: &name, size, mtime_ns: mtime, now_ns: now };
            let _ = r.matches(&f);
        }
    }
}
