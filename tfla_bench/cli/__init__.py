"""The command line: `main` builds the app; one module per command group, each exposing
`register(app)`; `paths` and `options` hold what the commands share."""
