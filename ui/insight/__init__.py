"""Under a reply: its speculation replayed step by step, and the what-if. The page's map: docs/page.md."""
