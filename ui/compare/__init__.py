"""The A/B and Sweep tabs: two configs compared, the one statistics module of every verdict, and its
words. The page's map: docs/page.md."""
