"""What every tab stands on: the header, the engine's description, the glossary, the prompt sets and
presets, the declared settings' controls and forms, the page's style. The page's map: docs/page.md."""
