"""The data and its known answers: `panel` (a user's panel loaded and validated, the HAR's features, the splits and
every kind of data the zoo trains on), `synthetic` (the embedded panel, drawn from a known HAR) and `reference`
(the answers every path must reach: OLS, and the HAR's gradient by formula)."""
