"""The Load tab, both modes: closed loop (two runs of N clients, differing in max batch) and open loop (a
rate sweep per max batch), running the load generator (server/load/).
The page's map: docs/page.md."""
