//! Listing pages, built once and kept: a page of `skills_list` with its JSON text, what it
//! depends on, and the last pages a workspace served.

use cloud_harness_skills::resolver::Tier;
use cloud_harness_store::cas::Digest;
use serde_json::Value;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

/// What a listing page depends on: the generation it shows and the request.
#[derive(PartialEq)]
pub(super) struct PageKey {
    pub(super) generation: Digest,
    pub(super) root: Option<String>,
    pub(super) tier: Option<Tier>,
    pub(super) include_shadowed: bool,
    pub(super) after: Option<String>,
    pub(super) limit: usize,
}

/// A built page of `skills_list`: its value, and that value as JSON text, written once (an MCP
/// answer carries both: as structured content, and as the text block for clients without
/// structured output).
pub struct ListPage {
    /// Unique in this process: no other page ever has it, even after this one is gone.
    pub id: u64,
    pub value: Value,
    pub json: String,
    /// `json` as a JSON string (the text block inside an answer), escaped once when first
    /// asked for.
    text: OnceLock<String>,
}

impl ListPage {
    pub fn new(value: Value) -> ListPage {
        let json = serde_json::to_string(&value).expect("listings serialize");
        ListPage {
            id: PAGES_BUILT.fetch_add(1, Ordering::Relaxed),
            value,
            json,
            text: OnceLock::new(),
        }
    }

    /// The page's JSON as a JSON string.
    pub fn text(&self) -> &str {
        self.text
            .get_or_init(|| serde_json::to_string(&self.json).expect("strings serialize"))
    }
}

static PAGES_BUILT: AtomicU64 = AtomicU64::new(0);

/// The pages built last. A generation never changes, so a page built from one stays true for
/// it; agents list the same pages over and over, and building one is most of a call's cost.
#[derive(Default)]
pub(super) struct Pages(Mutex<VecDeque<(PageKey, Arc<ListPage>)>>);

impl Pages {
    const KEPT: usize = 16;

    pub(super) fn get(&self, key: &PageKey) -> Option<Arc<ListPage>> {
        let pages = self.0.lock().expect("page cache lock");
        pages.iter().find(|(k, _)| k == key).map(|(_, v)| v.clone())
    }

    pub(super) fn put(&self, key: PageKey, page: Arc<ListPage>) {
        let mut pages = self.0.lock().expect("page cache lock");
        if pages.len() == Self::KEPT {
            pages.pop_front();
        }
        pages.push_back((key, page));
    }
}
