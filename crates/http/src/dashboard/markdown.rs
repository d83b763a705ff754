//! Untrusted Markdown (every SKILL.md is a toolkit's) to HTML that cannot run anything:
//! rendered by pulldown-cmark, then cleaned by ammonia's allow-list (no scripts, no event
//! handlers, no `javascript:` URLs, raw HTML reduced to harmless tags).

pub(crate) fn render(markdown: &str) -> String {
    let mut html = String::new();
    let parser = pulldown_cmark::Parser::new_ext(markdown, pulldown_cmark::Options::ENABLE_TABLES);
    pulldown_cmark::html::push_html(&mut html, parser);
    ammonia::Builder::default()
        // Links go out with no referrer and no access to this page.
        .link_rel(Some("noopener noreferrer nofollow"))
        // Images would load from anywhere: none.
        .rm_tags(&["img"])
        .clean(&html)
        .to_string()
}

/// SKILL.md split into its front matter (as written) and its body.
pub fn split_front_matter(text: &str) -> (Option<&str>, &str) {
    let Some(rest) = text
        .strip_prefix("---\n")
        .or_else(|| text.strip_prefix("---\r\n"))
    else {
        return (None, text);
    };
    match rest.find("\n---") {
        Some(end) => {
            let body = &rest[end + 4..];
            let body = body
                .strip_prefix('\n')
                .or_else(|| body.strip_prefix("\r\n"))
                .unwrap_or(body);
            (Some(&rest[..end]), body)
        }
        None => (None, text),
    }
}
