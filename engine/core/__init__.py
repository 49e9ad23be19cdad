"""Config and toggles, errors, the request and event types, the Timeline."""
