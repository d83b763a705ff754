//! The files a `SKILL.md` links to: what the Agent Skills specification's rule on file
//! references checks (each must be in the skill). Read from the body as Markdown writes links,
//! in one bounded pass: the body is third-party text of up to a MiB.

/// Links of a SKILL.md checked at most; a body with more is checked for these.
pub const MAX_REFERENCES: usize = 256;

/// The relative files a SKILL.md body links to (`[text](path)`, `![alt](path)`), outside code
/// blocks and code spans: no URL, no anchor alone, no absolute path; `#anchor` and `?query`
/// taken off, percent-escapes decoded. At most [`MAX_REFERENCES`], each once. Bounded for any
/// body: one pass over it, at most [`MAX_LINKS_LOOKED_AT`] link openings looked at, each
/// target read for at most [`MAX_TARGET`] bytes; with them, whether the body was read to its
/// end (false: a bound stopped the scan, and links after it are not checked).
pub fn references(body: &str) -> (Vec<String>, bool) {
    let mut out: Vec<String> = Vec::new();
    let mut looked_at = 0;
    // The open fence: its character and length (CommonMark: closed by at least as many).
    let mut fence: Option<(u8, usize)> = None;
    for line in body.lines() {
        let trimmed = line.trim_start();
        let run = |c: u8| trimmed.bytes().take_while(|&b| b == c).count();
        let marker = [b'`', b'~']
            .into_iter()
            .map(|c| (c, run(c)))
            .find(|&(_, n)| n >= 3);
        match (fence, marker) {
            (None, Some(m)) => {
                fence = Some(m);
                continue;
            }
            // A closing fence is the run alone (no info string after it).
            (Some((c, n)), Some((mc, mn)))
                if c == mc && mn >= n && trimmed.trim_end().len() == mn =>
            {
                fence = None;
                continue;
            }
            (Some(_), _) => continue,
            (None, None) => {}
        }
        let visible = outside_code_spans(line);
        let mut rest = visible.as_str();
        while let Some(at) = rest.find("](") {
            looked_at += 1;
            if looked_at > MAX_LINKS_LOOKED_AT {
                return (out, false);
            }
            rest = &rest[at + 2..];
            let (target, used) = link_target(rest);
            rest = &rest[used..];
            if let Some(path) = target.and_then(relative_target) {
                if !out.contains(&path) {
                    out.push(path);
                    if out.len() == MAX_REFERENCES {
                        return (out, false);
                    }
                }
            }
        }
    }
    (out, true)
}

/// Link openings (`](`) a body is searched for at most.
pub const MAX_LINKS_LOOKED_AT: usize = 4096;
/// The longest link target read; a longer one is no file reference.
pub const MAX_TARGET: usize = 1024;

/// The target at the start of `rest` (what follows `](`), and how many bytes were read: up
/// to a `)` that closes it (parentheses inside may nest) or white space, or inside `<…>`.
fn link_target(rest: &str) -> (Option<&str>, usize) {
    if let Some(angled) = rest.strip_prefix('<') {
        let end = angled
            .bytes()
            .take(MAX_TARGET)
            .position(|b| b == b'>' || b == b'\n');
        return match end {
            Some(end) if angled.as_bytes()[end] == b'>' => (Some(&angled[..end]), end + 2),
            Some(end) => (None, end + 1),
            None => (None, 1 + boundary_after(angled, MAX_TARGET)),
        };
    }
    let mut depth = 0usize;
    for (i, b) in rest.bytes().enumerate().take(MAX_TARGET) {
        match b {
            b'(' => depth += 1,
            b')' if depth == 0 => return (Some(&rest[..i]), i),
            b')' => depth -= 1,
            b' ' | b'\t' => return (Some(&rest[..i]), i),
            _ => {}
        }
    }
    if rest.len() <= MAX_TARGET {
        (Some(rest), rest.len())
    } else {
        // Past the bound: no reference, and the search goes on after what was read.
        (None, boundary_after(rest, MAX_TARGET))
    }
}

/// The first character boundary of `s` at or after `at` (its length, past its end).
fn boundary_after(s: &str, at: usize) -> usize {
    let mut end = at.min(s.len());
    while !s.is_char_boundary(end) {
        end += 1;
    }
    end
}

/// `line` without its inline code spans (a run of backticks up to the next run exactly as
/// long): a link written as code is an example, not a reference. One pass over the runs.
fn outside_code_spans(line: &str) -> String {
    if !line.contains('`') {
        return line.to_owned();
    }
    let bytes = line.as_bytes();
    // Every run of backticks: where it starts and how long it is.
    let mut runs: Vec<(usize, usize)> = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'`' {
            let start = i;
            while i < bytes.len() && bytes[i] == b'`' {
                i += 1;
            }
            runs.push((start, i - start));
        } else {
            i += 1;
        }
    }
    // For each length, the runs of that length in order: a span opened by one is closed by
    // the next of the same length.
    let mut by_len: std::collections::HashMap<usize, std::collections::VecDeque<usize>> =
        std::collections::HashMap::new();
    for (k, &(_, len)) in runs.iter().enumerate() {
        by_len.entry(len).or_default().push_back(k);
    }
    let mut out = String::with_capacity(line.len());
    let mut copied = 0;
    let mut k = 0;
    while k < runs.len() {
        let (start, len) = runs[k];
        let queue = by_len.get_mut(&len).expect("every run is queued");
        while queue.front().is_some_and(|&q| q <= k) {
            queue.pop_front();
        }
        match queue.pop_front() {
            Some(close) => {
                out.push_str(&line[copied..start]);
                copied = runs[close].0 + len;
                k = close + 1;
            }
            // An unclosed run is literal backticks.
            None => k += 1,
        }
    }
    out.push_str(&line[copied..]);
    out
}

fn relative_target(target: &str) -> Option<String> {
    let path = target.split(['#', '?']).next().unwrap_or("");
    let scheme = path.split_once(':').is_some_and(|(s, _)| {
        !s.is_empty()
            && s.chars()
                .all(|c| c.is_ascii_alphanumeric() || "+.-".contains(c))
    });
    if path.is_empty() || scheme || path.starts_with('/') || path.starts_with('\\') {
        return None;
    }
    let path = percent_decoded(path)?;
    let path = path
        .strip_prefix("./")
        .unwrap_or(&path)
        .trim_end_matches('/');
    (!path.is_empty()).then(|| path.to_owned())
}

/// `%XX` escapes decoded (as a link's target is written); `None` when that is not UTF-8.
fn percent_decoded(path: &str) -> Option<String> {
    if !path.contains('%') {
        return Some(path.to_owned());
    }
    let bytes = path.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = (bytes[i] == b'%')
            .then(|| bytes.get(i + 1..i + 3))
            .flatten()
            .filter(|h| h.iter().all(u8::is_ascii_hexdigit))
            .and_then(|h| std::str::from_utf8(h).ok())
            .and_then(|h| u8::from_str_radix(h, 16).ok());
        match hex {
            Some(b) => {
                out.push(b);
                i += 3;
            }
            None => {
                out.push(bytes[i]);
                i += 1;
            }
        }
    }
    String::from_utf8(out).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn references_are_the_relative_links_outside_code() {
        let body = "See [the form](reference/forms.md#top) and ![chart](./img/a.png).\n\
            [site](https://example.com) [mail](mailto:a@b) [anchor](#x) [abs](/etc/passwd)\n\
            ```\n[in code](nope.md)\n```\n\
            [again](reference/forms.md) [spaced](<docs/a b.md>) [dir](scripts/)\n\
            An example: `see [x](./x.md)` and ``[y](y.md)`` are code; ``` `[z](z.md)` ``` too.\n";
        assert_eq!(
            references(body).0,
            vec!["reference/forms.md", "img/a.png", "docs/a b.md", "scripts"]
        );
        let many: String = (0..1000).map(|i| format!("[f](f{i}.md)\n")).collect();
        assert_eq!(references(&many).0.len(), MAX_REFERENCES);
        let odd = "[a](caf%C3%A9.md) [b](foo(1).md) [c](a%2Fb.md) [d](x%+5.md)\n````\n```\n```python\n[in](code.md)\n````\n[after](after.md)\n";
        assert_eq!(
            references(odd).0,
            vec!["café.md", "foo(1).md", "a/b.md", "x%+5.md", "after.md"]
        );
    }

    /// The worst bodies a toolkit can write cost one bounded pass: link openings that never
    /// make a reference, huge targets, and lines of unclosed backtick runs of every length.
    #[test]
    fn references_of_hostile_bodies_are_bounded() {
        let openings = "](/".repeat(350_000);
        assert!(references(&openings).0.is_empty());
        let huge: String = (0..256)
            .map(|i| format!("[x](a{i}{})\n", "a".repeat(4000)))
            .collect();
        assert!(references(&huge).0.is_empty());
        let angled = format!("[x](<{}", "é".repeat(2000));
        assert!(references(&angled).0.is_empty());
        let backticks: String = (1..1400).map(|n| "`".repeat(n) + "x").collect();
        assert_eq!(outside_code_spans(&backticks), backticks);
        let spans = "`a` [x](x.md) ``b`` [y](y.md) ```c``` [z](z.md)";
        assert_eq!(references(spans).0, vec!["x.md", "y.md", "z.md"]);
    }
}
