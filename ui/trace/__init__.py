"""The Trace downloads: a reply, an A/B pair or a Load run as one Chrome Trace Event file. The page's
map: docs/page.md."""
