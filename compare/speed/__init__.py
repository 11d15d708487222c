"""Speed, measured in one run and never asserted: `bench` (every path on the HAR, and the zoo with `--models`) and
`walk_forward` (every refit of every asset trained at once)."""
