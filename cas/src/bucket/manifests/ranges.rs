//! Which page ranges of a manifest file are published as objects, and which
//! to send when the file grows.
//!
//! A commit appends pages, so each publication sends the new tail. Sent
//! alone, tails would make the list of ranges in the root grow by one per
//! commit; instead a new tail absorbs the ranges before it while the last
//! of them is no longer than what it has absorbed so far (a binary
//! counter): the list stays within about log2(pages) ranges below the
//! size cap, and each page is sent about log2 times over its life. No range
//! passes [`MAX_RANGE_PAGES`] (16 MiB), so a large manifest is many capped
//! ranges plus a short counter.

/// Pages of the largest range object (16 MiB).
pub const MAX_RANGE_PAGES: u64 = 4096;

/// The ranges published, contiguous from `first_page`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Ranges {
    pub list: Vec<(u64, u64)>,
}

impl Ranges {
    /// Where the published pages end (`first_page` when none are).
    pub fn end(&self, first_page: u64) -> u64 {
        self.list.last().map_or(first_page, |r| r.1)
    }

    /// The list after growing to `end`, and the ranges of it to send (those
    /// not already published).
    pub fn grow(&self, first_page: u64, end: u64) -> (Ranges, Vec<(u64, u64)>) {
        let mut list = self.list.clone();
        let mut at = self.end(first_page);
        while at < end {
            let mut cur = (at, end.min(at + MAX_RANGE_PAGES));
            at = cur.1;
            while let Some(&prev) = list.last() {
                let (p, c) = (prev.1 - prev.0, cur.1 - cur.0);
                if prev.1 != cur.0 || p > c || p + c > MAX_RANGE_PAGES {
                    break;
                }
                list.pop();
                cur.0 = prev.0;
            }
            list.push(cur);
        }
        let send = list.iter().copied().filter(|r| !self.list.contains(r)).collect();
        (Ranges { list }, send)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tails_merge_like_a_binary_counter() {
        let mut r = Ranges::default();
        let mut sent_pages = 0;
        for end in 3..=1002u64 {
            let (next, send) = r.grow(2, end);
            assert!(!send.is_empty());
            sent_pages += send.iter().map(|s| s.1 - s.0).sum::<u64>();
            let mut at = 2;
            for &(a, b) in &next.list {
                assert_eq!(a, at, "contiguous");
                at = b;
            }
            assert_eq!(at, end);
            assert!(next.list.len() <= 11, "{} ranges at {end}", next.list.len());
            r = next;
        }
        assert!(sent_pages <= 1000 * 11, "each page sent about log2 times: {sent_pages}");
        assert_eq!(r.grow(2, 1002).1, vec![], "nothing new, nothing sent");
    }

    #[test]
    fn ranges_are_capped() {
        let (r, send) = Ranges::default().grow(2, 2 + 3 * MAX_RANGE_PAGES + 5);
        assert_eq!(r.list.len(), 4);
        assert_eq!(send, r.list);
        assert!(r.list.iter().all(|x| x.1 - x.0 <= MAX_RANGE_PAGES));
        let (r2, send) = r.grow(2, 2 + 3 * MAX_RANGE_PAGES + 10);
        assert_eq!(send, vec![(2 + 3 * MAX_RANGE_PAGES, 2 + 3 * MAX_RANGE_PAGES + 10)]);
        assert_eq!(r2.list.len(), 4);
    }
}
