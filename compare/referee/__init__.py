"""The referee's judgement: `checks` (each parity claim against its tolerance), `tolerances` (every tolerance, with
its reason), `zoo` (the matrix of models × optimizers × paths), `seed_noise` (is a difference beyond what seeds
alone move?), `report` (the tables) and `figures`."""
