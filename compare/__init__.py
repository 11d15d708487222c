"""The referee: data and the OLS reference, one worker process per engine, the parity checks and the report."""
