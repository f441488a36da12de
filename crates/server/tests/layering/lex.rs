//! The lexer of the layering test: Rust source as tokens with line numbers, without comments,
//! literals' contents and inline test modules.

/// `src` with comments and the insides of string and char literals replaced by spaces
/// (newlines kept, so lines still count): `crate::` in a doc comment or a message is no import.
pub(crate) fn blank_comments_and_literals(src: &str) -> String {
    let mut b = Blanker {
        chars: src.chars().collect(),
        out: String::with_capacity(src.len()),
        i: 0,
    };
    while let Some(c) = b.at(0) {
        let next = b.at(1);
        let ident_before = b.i > 0 && is_ident_char(b.chars[b.i - 1]);
        if c == '/' && next == Some('/') {
            b.line_comment();
        } else if c == '/' && next == Some('*') {
            b.block_comment();
        } else if let Some(hashes) = raw_string_start(&b.chars, b.i).filter(|_| !ident_before) {
            b.raw_string(hashes);
        } else if c == '"' {
            b.string();
        } else if c == '\'' && (next == Some('\\') || b.at(2) == Some('\'')) {
            b.char_literal();
        } else {
            b.out.push(c);
            b.i += 1;
        }
    }
    b.out
}

fn is_ident_char(c: char) -> bool {
    c.is_alphanumeric() || c == '_'
}

/// Copies source to `out`, blanking what is no code.
struct Blanker {
    chars: Vec<char>,
    out: String,
    i: usize,
}

impl Blanker {
    fn at(&self, ahead: usize) -> Option<char> {
        self.chars.get(self.i + ahead).copied()
    }

    /// Blanks `n` characters (newlines stay).
    fn blank(&mut self, n: usize) {
        for _ in 0..n {
            if let Some(c) = self.at(0) {
                self.out.push(if c == '\n' { '\n' } else { ' ' });
            }
            self.i += 1;
        }
    }

    fn line_comment(&mut self) {
        while self.at(0).is_some_and(|c| c != '\n') {
            self.blank(1);
        }
    }

    /// `/* .. */`, nested ones included.
    fn block_comment(&mut self) {
        let mut depth = 0;
        while let Some(c) = self.at(0) {
            if c == '/' && self.at(1) == Some('*') {
                depth += 1;
                self.blank(2);
            } else if c == '*' && self.at(1) == Some('/') {
                depth -= 1;
                self.blank(2);
                if depth == 0 {
                    break;
                }
            } else {
                self.blank(1);
            }
        }
    }

    /// `r".."`, `r#".."#`, `br".."`, `cr".."`: no escapes; ends at `"` and as many `#`.
    fn raw_string(&mut self, hashes: usize) {
        let open = self.chars[self.i..].iter().position(|&c| c == '"');
        self.blank(open.unwrap_or(0) + 1);
        while let Some(c) = self.at(0) {
            if c == '"' && (1..=hashes).all(|k| self.at(k) == Some('#')) {
                self.blank(hashes + 1);
                break;
            }
            self.blank(1);
        }
    }

    /// `".."` (also `b".."`, `c".."`: the prefix is left as an identifier), with escapes.
    fn string(&mut self) {
        self.blank(1);
        while let Some(c) = self.at(0) {
            match c {
                '\\' => self.blank(2),
                '"' => {
                    self.blank(1);
                    break;
                }
                _ => self.blank(1),
            }
        }
    }

    /// A char literal (`'x'`, `'\n'`, `'\''`), not a lifetime or a label.
    fn char_literal(&mut self) {
        let len = if self.at(1) == Some('\\') {
            (3..)
                .find(|&k| self.at(k).is_none_or(|c| c == '\''))
                .unwrap_or(3)
                + 1
        } else {
            3
        };
        self.blank(len);
    }
}

/// At a raw string literal (`r`, `br` or `cr`, then `#`s and `"`): the number of `#`s.
pub(crate) fn raw_string_start(chars: &[char], i: usize) -> Option<usize> {
    let mut k = i;
    if matches!(chars.get(k), Some('b' | 'c')) {
        k += 1;
    }
    if chars.get(k) != Some(&'r') {
        return None;
    }
    k += 1;
    let hashes = chars[k..].iter().take_while(|&&c| c == '#').count();
    (chars.get(k + hashes) == Some(&'"')).then_some(hashes)
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Tok {
    Ident(String),
    PathSep,
    Punct(char),
}

pub(crate) fn tokens(src: &str) -> Vec<(Tok, usize)> {
    let blanked = blank_comments_and_literals(src);
    let chars: Vec<char> = blanked.chars().collect();
    let mut out = Vec::new();
    let (mut i, mut line) = (0, 1);
    while i < chars.len() {
        let c = chars[i];
        if c == '\n' {
            line += 1;
            i += 1;
        } else if c.is_whitespace() {
            i += 1;
        } else if is_ident_char(c) {
            let start = i;
            while i < chars.len() && is_ident_char(chars[i]) {
                i += 1;
            }
            out.push((Tok::Ident(chars[start..i].iter().collect()), line));
        } else if c == ':' && chars.get(i + 1) == Some(&':') {
            out.push((Tok::PathSep, line));
            i += 2;
        } else {
            out.push((Tok::Punct(c), line));
            i += 1;
        }
    }
    out
}

pub(crate) fn is_ident(tok: Option<&(Tok, usize)>, name: &str) -> bool {
    matches!(tok, Some((Tok::Ident(n), _)) if n == name)
}

pub(crate) fn is_sep(tok: Option<&(Tok, usize)>) -> bool {
    matches!(tok, Some((Tok::PathSep, _)))
}

pub(crate) fn is_punct(tok: Option<&(Tok, usize)>, c: char) -> bool {
    matches!(tok, Some((Tok::Punct(p), _)) if *p == c)
}

/// Index just past the bracket group opening at `open` (`{`, `[` or `(`).
pub(crate) fn past_group(toks: &[(Tok, usize)], open: usize) -> usize {
    let mut depth = 0usize;
    for (k, (tok, _)) in toks.iter().enumerate().skip(open) {
        match tok {
            Tok::Punct('{' | '[' | '(') => depth += 1,
            Tok::Punct('}' | ']' | ')') => {
                depth = depth.saturating_sub(1);
                if depth == 0 {
                    return k + 1;
                }
            }
            _ => {}
        }
    }
    toks.len()
}

/// The tokens of a file without its inline test modules (`#[cfg(test)] mod x { .. }`, other
/// attributes and a visibility allowed in between). Test modules do not count, as in the hook:
/// they do not ship, and a test may reach across layers to check one. Other `#[cfg(test)]`
/// items count (the hook counts them too).
pub(crate) fn non_test_tokens(src: &str) -> Vec<(Tok, usize)> {
    let toks = tokens(src);
    let mut out = Vec::with_capacity(toks.len());
    let mut i = 0;
    while i < toks.len() {
        if let Some(end) = test_module_end(&toks, i) {
            i = end;
        } else {
            out.push(toks[i].clone());
            i += 1;
        }
    }
    out
}

/// At `#[cfg(test)]` heading an inline module: the index past the module's closing brace.
pub(crate) fn test_module_end(toks: &[(Tok, usize)], i: usize) -> Option<usize> {
    let cfg_test = [
        Tok::Punct('#'),
        Tok::Punct('['),
        Tok::Ident("cfg".into()),
        Tok::Punct('('),
        Tok::Ident("test".into()),
        Tok::Punct(')'),
        Tok::Punct(']'),
    ];
    let heads = toks.get(i..i + cfg_test.len())?;
    if !heads.iter().map(|(t, _)| t).eq(cfg_test.iter()) {
        return None;
    }
    let mut k = i + cfg_test.len();
    while is_punct(toks.get(k), '#') && is_punct(toks.get(k + 1), '[') {
        k = past_group(toks, k + 1);
    }
    if is_ident(toks.get(k), "pub") {
        k += 1;
        if is_punct(toks.get(k), '(') {
            k = past_group(toks, k);
        }
    }
    let named = matches!(toks.get(k + 1), Some((Tok::Ident(_), _)));
    (is_ident(toks.get(k), "mod") && named && is_punct(toks.get(k + 2), '{'))
        .then(|| past_group(toks, k + 2))
}
