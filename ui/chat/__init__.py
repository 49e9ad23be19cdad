"""The Chat tab: conversations on the server, the token stream and its transports, the browser's
timings, smoothing, markdown and the live overlays. The page's map: docs/page.md."""
