"""From a daily panel to the float32 arrays every path trains on.

    validate schema -> log RV -> HAR features (d1, s5, m22, lev: all known the evening before)
    -> date split (train < split <= test) -> the validation rows: the last year before the split, carved out of
    training (or, with validation="test", the test split itself: a train/test curve)
    -> standardize with TRAINING statistics only -> HarData
"""
from __future__ import annotations

import dataclasses
import difflib
import re
import stat
import warnings
from pathlib import Path

import numpy as np
import pandas as pd

from compare.data import synthetic
from compare.errors import HarDataError
from keras_side.data import HarData, SEQUENCE_DAYS, Scaling

COLUMNS = ("fecha", "activo", "rendimiento", "rv_5min")
HAR = ("d1", "s5", "m22")
LEVERAGE = ("lev",)  # min(r_{t-1}, 0): yesterday's negative return
DEFAULT_ASSET = "indice"
DEFAULT_SPLIT = "2018-01-01"
DEFAULT_DATA_SEED = 0
# Below this a side of the split cannot carry a 22-day window, four coefficients and a validation curve.
MIN_ROWS_PER_SIDE = 50
# Where the validation curve is measured: "last-year", the year before the split, which training then leaves out
# (the test split stays untouched until the final report); or "test", the test split itself, as a train/test curve plots it.
VALIDATIONS = ("last-year", "test")
DEFAULT_VALIDATION = "last-year"


def load_panel(path: str | Path | None = None, *, seed: int = DEFAULT_DATA_SEED) -> tuple[pd.DataFrame, str]:
    """The user's parquet or CSV, validated; or the embedded synthetic panel when `path` is None.

    Returns the panel and a one-line description of its source.
    """
    if path is None:
        return synthetic.simulate(seed), f"synthetic(seed={seed})"
    path = Path(path)
    try:
        mode = path.stat().st_mode
    except FileNotFoundError:  # a dangling link too
        raise HarDataError(f"data file {str(path)!r} does not exist; pass an existing parquet or CSV with --data") \
            from None
    except OSError as err:  # a name too long, a folder without permission
        raise HarDataError(f"--data {str(path)!r}: {err.strerror}; check the path") from None
    if stat.S_ISDIR(mode):
        raise HarDataError(f"--data {str(path)!r} is a folder; pass the parquet or CSV file itself")
    if not stat.S_ISREG(mode):  # a device, a named pipe: nothing to read a panel from
        raise HarDataError(f"--data {str(path)!r} is not a regular file; pass the parquet or CSV file itself")
    suffix = path.suffix.lower()
    if suffix not in (".parquet", ".pq", ".csv"):
        raise HarDataError(f"data file {str(path)!r} is neither .parquet nor .csv; convert it or rename it")
    try:
        with open(path, "rb") as file:  # the open file, not its name: pyarrow takes UTF-8 names only
            frame = pd.read_csv(file) if suffix == ".csv" else pd.read_parquet(file)
    except Exception as err:  # any reader failure is the same user problem: the file is not what it says
        kind = "CSV" if suffix == ".csv" else "parquet"
        reason = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise HarDataError(f"cannot read {str(path)!r} as {kind} ({reason}); check the file is not damaged") from None
    return validate(frame), str(path).encode("utf-8", "replace").decode()  # a name that is not UTF-8 prints


def validate(frame: pd.DataFrame) -> pd.DataFrame:
    """Check the columns and values; return a clean copy sorted by asset and date."""
    repeated = sorted({str(c) for c in frame.columns[frame.columns.duplicated()]} & set(COLUMNS))
    if repeated:  # a parquet keeps both; pandas renames a CSV's second one 'rv_5min.1' (below), and we'd read the first
        raise HarDataError(f"column(s) {', '.join(map(repr, repeated))} appear more than once; keep one of each")
    renamed = [f"{c}.1" for c in COLUMNS if f"{c}.1" in frame.columns]
    if renamed:
        raise HarDataError(f"column {renamed[0][:-2]!r} appears more than once (pandas named the second "
                           f"{renamed[0]!r}); keep one of each")
    missing = [c for c in COLUMNS if c not in frame.columns]
    if missing:
        if len(frame.columns) == 1 and ";" in str(frame.columns[0]):
            raise HarDataError("the CSV looks separated by ';' (one column named "
                               f"{str(frame.columns[0])[:40]!r}...); write it with ',' separators")
        hints = []
        for col in missing:
            close = difflib.get_close_matches(col, [str(c) for c in frame.columns], n=1)
            hints.append(f"{col!r}" + (f" (found {close[0]!r}: rename it)" if close else ""))
        raise HarDataError(f"missing column(s) {', '.join(hints)}; the data needs columns {', '.join(COLUMNS)}")
    if frame.empty:
        raise HarDataError("the data has its columns but no rows; pass a file with the panel's days")
    frame = frame[list(COLUMNS)].copy()
    for col in ("fecha", "activo"):  # an empty date or asset would be read as NaT or 'nan', as if a real one
        empty = frame[col].isna().to_numpy() | (frame[col].astype(str).str.strip() == "").to_numpy()
        if empty.any():
            raise HarDataError(f"column {col!r} has {int(empty.sum())} empty value(s) (the first in data row "
                               f"{int(np.argmax(empty)) + 1}); every row needs its date and its asset")
    for col, kind in (("fecha", "dates"), ("rendimiento", "numbers"), ("rv_5min", "numbers")):
        present = frame[col].dropna()  # with a missing value pandas keeps True/False as objects
        if pd.api.types.is_bool_dtype(present) or (present.dtype == object and len(present) and present.map(
                lambda v: isinstance(v, (bool, np.bool_))).all()):
            raise HarDataError(f"column {col!r} holds True/False, not {kind}; write the values themselves")
    frame["fecha"] = _calendar_days(frame["fecha"])
    frame["activo"] = frame["activo"].astype(str)
    for col in ("rendimiento", "rv_5min"):
        frame[col] = pd.to_numeric(frame[col], errors="coerce")
    _require_finite(frame, "rendimiento", np.isfinite(frame["rendimiento"]), "must be a finite number")
    _require_finite(frame, "rv_5min", np.isfinite(frame["rv_5min"]) & (frame["rv_5min"] > 0),
                    "realized variance must be finite and > 0")
    dup = frame.duplicated(["fecha", "activo"])
    if dup.any():
        first = frame[dup].iloc[0]
        raise HarDataError(
            f"{int(dup.sum())} duplicate (fecha, activo) rows (first on {first.fecha:%Y-%m-%d}, asset "
            f"{first.activo!r}); keep one row per asset and day"
        )
    constant = sorted(a for a, n in frame.groupby("activo")["rv_5min"].nunique().items() if n == 1)
    if constant:
        raise HarDataError(f"'rv_5min' is constant for asset(s) {', '.join(map(repr, constant))}: its HAR features "
                           "would be constant and OLS has no answer; drop the asset or fix its values")
    return frame.sort_values(["activo", "fecha"], ignore_index=True)


# A date written day or month first ("02/01/2008"). pandas guesses the order from the first value, then reads a value
# that does not fit it (a day over 12) the other way, so a day-first file would load with 1 February for 2 January.
DAY_MONTH_FIRST = re.compile(r"\s*\d{1,2}[/.-]\d{1,2}[/.-]\d{2,4}\b")


def _calendar_days(values: pd.Series) -> pd.Series:
    """Dates as naive timestamps, each row keeping its own calendar date: a daily panel's day is the day it was
    recorded in, whatever its time zone. Dates with one time zone drop it; dates with several offsets (an export
    across a daylight-saving change), some with a zone and some without, or in several formats, are read one by
    one. A time of day is dropped too (two rows of one day are a duplicate); numbers are refused (pandas would read
    them as nanoseconds since 1970), and so are dates written day or month first (`DAY_MONTH_FIRST`)."""
    if pd.api.types.is_numeric_dtype(values):
        raise HarDataError(f"column 'fecha' holds numbers ({values.iloc[0]}, ...), not dates; write them as "
                           "YYYY-MM-DD")
    if not pd.api.types.is_datetime64_any_dtype(values):
        ambiguous = values[values.astype(str).str.match(DAY_MONTH_FIRST)]
        if len(ambiguous):
            raise HarDataError(f"column 'fecha' has dates like {ambiguous.iloc[0]!r}, which read day first or month "
                               "first as well; write them as YYYY-MM-DD")
    try:
        with warnings.catch_warnings():  # "Could not infer format": pandas then reads each value alone, as we want
            warnings.simplefilter("ignore", UserWarning)
            dates = pd.to_datetime(values)
    except (ValueError, TypeError):  # several offsets, or formats pandas does not infer from the first value
        try:
            dates = pd.Series([pd.Timestamp(v).tz_localize(None) for v in values], index=values.index)
            return pd.to_datetime(dates).dt.normalize()
        except (ValueError, TypeError):
            raise HarDataError("column 'fecha' has values that are not dates; write them as YYYY-MM-DD") from None
    return (dates.dt.tz_localize(None) if dates.dt.tz is not None else dates).dt.normalize()


def _require_finite(frame: pd.DataFrame, col: str, ok: pd.Series, why: str) -> None:
    bad = ~ok.fillna(False).astype(bool)
    if bad.any():
        first = frame[bad].iloc[0]
        raise HarDataError(
            f"{col!r} has {int(bad.sum())} missing or invalid values (first on {first.fecha:%Y-%m-%d}, "
            f"asset {first.activo!r}); {why}"
        )


def har_features(panel: pd.DataFrame, asset: str) -> pd.DataFrame:
    """One asset's HAR design, indexed by date: features known on the evening of t-1, target y = log RV_t."""
    known = sorted(panel["activo"].unique())
    if asset not in known:
        raise HarDataError(f"unknown asset {asset!r}; the data has {', '.join(known)} (choose one with --asset)")
    one = panel[panel["activo"] == asset].set_index("fecha")
    log_rv = np.log(one["rv_5min"])
    out = pd.DataFrame(
        {
            "d1": log_rv.shift(1),
            "s5": log_rv.rolling(5).mean().shift(1),
            "m22": log_rv.rolling(22).mean().shift(1),
            "lev": one["rendimiento"].clip(upper=0.0).shift(1),
            "y": log_rv,
        }
    )
    out = out.dropna()
    if out.empty:
        raise HarDataError(f"asset {asset!r} has {len(one)} days; the HAR needs more than {SEQUENCE_DAYS} (22 to "
                           "average, then the days it predicts): give it more days or leave it out")
    return out


def split_dates(design: pd.DataFrame, split: str, end: str | None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Train: before `split`. Test: from `split` to `end` (inclusive; default the last day)."""
    split_ts = _date(split, "--split")
    end_ts = _date(end, "--end") if end is not None else design.index.max()
    first, last = design.index.min(), design.index.max()
    if not first < split_ts <= last:
        raise HarDataError(
            f"split date {split_ts:%Y-%m-%d} is outside the data ({first:%Y-%m-%d} to {last:%Y-%m-%d}); "
            "pick a --split date inside it"
        )
    if end_ts < split_ts:
        raise HarDataError(f"end date {end_ts:%Y-%m-%d} is before the split date {split_ts:%Y-%m-%d}; move --end")
    train = design[design.index < split_ts]
    test = design[(design.index >= split_ts) & (design.index <= end_ts)]
    _enough(("training", train), ("test", test))
    return train, test


def of_asset(asset: str, fn, *args):
    """`fn(*args)` for one asset of several: a data error names the asset it is about."""
    try:
        return fn(*args)
    except HarDataError as err:
        named = str(err) if str(err).startswith((f"asset {asset!r}", "--")) else f"asset {asset!r}: {err}"
        raise HarDataError(named) from None


def split_three(design: pd.DataFrame, split: str, end: str | None,
                validation: str = DEFAULT_VALIDATION) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """(train, validation, test) rows: `split_dates`, then the validation rows. With "last-year" they are the year
    before the split date, [split - 1 year, split), which training then leaves out; with "test" training keeps every
    row before the split and the validation rows are the test split (a train/test curve)."""
    if validation not in VALIDATIONS:
        raise HarDataError(f"unknown validation {validation!r}; --validation takes {' or '.join(VALIDATIONS)}")
    train, test = split_dates(design, split, end)
    if validation == "test":
        return train, test, test
    start = _date(split, "--split") - pd.DateOffset(years=1)
    val, train = train[train.index >= start], train[train.index < start]
    _enough(("training (before the validation year)", train), ("validation", val),
            fix="move --split later, or pass --validation test")
    return train, val, test


def require_spread(train: pd.DataFrame, columns) -> None:
    """The inputs and targets are scaled by their spread over the training rows, and OLS needs it: a column that
    does not vary there (an asset's 'rv_5min' constant before --split, though not after) has none."""
    flat = [c for c in columns if not train[c].std(ddof=0) > 0]
    if flat:
        first, last = train.index.min(), train.index.max()
        verb = "does" if len(flat) == 1 else "do"
        raise HarDataError(f"{', '.join(flat)} {verb} not vary over the {len(train):,} training rows ({first:%Y-%m-%d} "
                           f"to {last:%Y-%m-%d}), so they cannot be scaled and OLS has no answer; fix the data there "
                           "(a constant rv_5min?), or move --split")


def _enough(*sides: tuple[str, pd.DataFrame], fix: str = "move --split or --end") -> None:
    for name, side in sides:
        if len(side) < MIN_ROWS_PER_SIDE:
            raise HarDataError(f"only {len(side)} {name} rows (need at least {MIN_ROWS_PER_SIDE}); {fix}")


def _date(text: str, flag: str) -> pd.Timestamp:
    """A calendar day: not empty or NaT, without a time zone (the panel's days have none), in years 1 to 9999."""
    try:
        day = pd.Timestamp(text)
    except (ValueError, TypeError, OverflowError):
        day = pd.NaT
    if pd.isna(day) or day.tzinfo is not None or not 1 <= day.year <= 9999:
        raise HarDataError(f"{flag} {text!r} is not a date; write it as YYYY-MM-DD")
    return day


def standardize(
    sides: tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame], inputs: tuple[tuple[str, ...], ...], *, asset: str,
    source: str, validation: str, targets: tuple[str, ...] = ("y",), extra_inputs: tuple[np.ndarray, ...] = (),
) -> HarData:
    """Scale the (train, validation, test) rows with training statistics only; group the columns into the model's
    inputs (float32). Every target is log RV, so each is scaled with the statistics of "y"; several targets (a model
    with several outputs) travel as a tuple. `extra_inputs`: one more input array per side (the panel's ids)."""
    train = sides[0]
    names = tuple(c for group in inputs for c in group)
    if asset == "all":  # the panel: every asset's rows, scaled together
        require_spread(train, (*names, *targets))
    else:
        of_asset(asset, require_spread, train, (*names, *targets))
    x_mean = train[list(names)].mean().to_numpy()
    x_std = train[list(names)].std(ddof=0).to_numpy()
    y_mean, y_std = float(train["y"].mean()), float(train["y"].std(ddof=0))
    scaling = Scaling(x_mean=x_mean, x_std=x_std, y_mean=y_mean, y_std=y_std)

    def arrays(side: pd.DataFrame, extra):
        z = ((side[list(names)].to_numpy() - x_mean) / x_std).astype(np.float32)
        groups, i = [], 0
        for group in inputs:
            groups.append(z[:, i : i + len(group)])
            i += len(group)
        groups += [extra] if extra is not None else []
        ys = [((side[t].to_numpy() - y_mean) / y_std).astype(np.float32).reshape(-1, 1) for t in targets]
        return tuple(groups) if len(groups) > 1 else groups[0], tuple(ys) if len(ys) > 1 else ys[0]

    (x_train, y_train), (x_val, y_val), (x_test, y_test) = (
        arrays(side, extra_inputs[k] if extra_inputs else None) for k, side in enumerate(sides))
    return HarData(x_train=x_train, y_train=y_train, x_val=x_val, y_val=y_val, x_test=x_test, y_test=y_test,
                   scaling=scaling, features=names, asset=asset, source=source, validation=validation)


def prepare(
    panel: pd.DataFrame, *, asset: str = DEFAULT_ASSET, split: str = DEFAULT_SPLIT, end: str | None = None,
    validation: str = DEFAULT_VALIDATION, leverage: bool = False, source: str = "",
) -> HarData:
    """The HAR data set of one asset: one input (d1, s5, m22), or two with `leverage` (HAR means; lev)."""
    sides = split_three(har_features(panel, asset), split, end, validation)
    inputs = (HAR, LEVERAGE) if leverage else (HAR,)
    return standardize(sides, inputs, asset=asset, source=source, validation=validation)


def prepare_panel(panel: pd.DataFrame, *, split: str = DEFAULT_SPLIT, end: str | None = None,
                  validation: str = DEFAULT_VALIDATION, source: str = "") -> HarData:
    """All assets stacked, for the panel model: inputs (d1, s5, m22) and the integer asset id (n, 1)."""
    assets = sorted(panel["activo"].unique())
    per_asset = [_panel_sides(panel, a, split, end, validation) for a in assets]
    sides = tuple(pd.concat([s[k] for s in per_asset]) for k in range(3))
    ids = tuple(np.concatenate([np.full((len(s[k]), 1), i, np.int32) for i, s in enumerate(per_asset)])
                for k in range(3))
    return standardize(sides, (HAR,), asset="all", source=source, validation=validation, extra_inputs=ids)


def _panel_sides(panel: pd.DataFrame, asset: str, split: str, end: str | None, validation: str):
    """One asset's (train, validation, test) rows for the panel model. It trains on every asset, so one that cannot
    be split stops a command given another --asset: the error says why."""
    try:
        return of_asset(asset, split_three, har_features(panel, asset), split, end, validation)
    except HarDataError as err:
        raise HarDataError(f"{err} (the panel model trains on every asset of the data, so {asset!r} too: leave it "
                           "out of the data, or train another model)") from None


def prepare_sequences(panel: pd.DataFrame, *, asset: str = DEFAULT_ASSET, split: str = DEFAULT_SPLIT,
                      end: str | None = None, validation: str = DEFAULT_VALIDATION, source: str = "") -> HarData:
    """For sequence models: the last 22 days of log RV, oldest first, (n, 22, 1); the target is the day's log RV.
    The same days as the HAR design, both standardized with the training days' log RV mean and std."""
    design = har_features(panel, asset)
    log_rv = np.log(panel[panel["activo"] == asset].set_index("fecha")["rv_5min"])
    lags = pd.concat([log_rv.shift(k) for k in range(SEQUENCE_DAYS, 0, -1)], axis=1).loc[design.index]
    sides = split_three(design, split, end, validation)
    of_asset(asset, require_spread, sides[0], ("y",))
    mean, std = float(sides[0]["y"].mean()), float(sides[0]["y"].std(ddof=0))

    def arrays(side: pd.DataFrame):
        x = (lags.loc[side.index].to_numpy() - mean) / std
        return x[..., None].astype(np.float32), ((side["y"].to_numpy() - mean) / std).astype(np.float32)[:, None]

    (x_train, y_train), (x_val, y_val), (x_test, y_test) = map(arrays, sides)
    return HarData(x_train=x_train, y_train=y_train, x_val=x_val, y_val=y_val, x_test=x_test, y_test=y_test,
                   scaling=Scaling(np.full(1, mean), np.full(1, std), mean, std), features=("log_rv_lags",),
                   asset=asset, source=source, validation=validation)


def prepare_direction(panel: pd.DataFrame, *, asset: str = DEFAULT_ASSET, split: str = DEFAULT_SPLIT,
                      end: str | None = None, validation: str = DEFAULT_VALIDATION, source: str = "") -> HarData:
    """For a classifier: the standardized HAR means and, as target, 1.0 when the day's return is positive."""
    data = prepare(panel, asset=asset, split=split, end=end, validation=validation, source=source)
    sides = split_three(har_features(panel, asset), split, end, validation)
    returns = panel[panel["activo"] == asset].set_index("fecha")["rendimiento"]
    up = [(returns.loc[side.index].to_numpy() > 0).astype(np.float32)[:, None] for side in sides]
    scaling = dataclasses.replace(data.scaling, y_mean=0.0, y_std=1.0)  # a probability: no units to restore
    return dataclasses.replace(data, y_train=up[0], y_val=up[1], y_test=up[2], scaling=scaling)


HORIZON_DAYS = 5  # the second output of a two-horizon model: the mean log RV of the next 5 days, t to t+4


def prepare_horizons(panel: pd.DataFrame, *, asset: str = DEFAULT_ASSET, split: str = DEFAULT_SPLIT,
                     end: str | None = None, validation: str = DEFAULT_VALIDATION, source: str = "") -> HarData:
    """For a two-output model: the HAR means, and two targets, the day's log RV and the mean log RV of the
    `HORIZON_DAYS` days from it (a tuple, as Keras takes the targets of a two-output model); days whose horizon
    runs past the data are dropped."""
    design = har_features(panel, asset)
    log_rv = np.log(panel[panel["activo"] == asset].set_index("fecha")["rv_5min"])
    design["y5"] = log_rv.rolling(HORIZON_DAYS).mean().shift(1 - HORIZON_DAYS)
    train, val, test = split_three(design.dropna(), split, end, validation)
    # A split's last days would average days of the next split into their target: drop them, so that training
    # never sees a validation or test day, nor validation a test day (the test split's end: dropna above).
    gap = HORIZON_DAYS - 1
    train, val = train.iloc[:-gap], val if val is test else val.iloc[:-gap]
    return standardize((train, val, test), (HAR,), asset=asset, source=source, validation=validation,
                       targets=("y", "y5"))


RECENT_HALF_LIFE = 252  # trading days: a year-old day counts half as much as the last training day


def prepare_recent(panel: pd.DataFrame, *, asset: str = DEFAULT_ASSET, split: str = DEFAULT_SPLIT,
                   end: str | None = None, validation: str = DEFAULT_VALIDATION, source: str = "") -> HarData:
    """The HAR data set with a weight per training day, halving every `RECENT_HALF_LIFE` days back from the last
    training day: trained with these as `sample_weight`, the HAR is weighted least squares that favours recent
    volatility."""
    data = prepare(panel, asset=asset, split=split, end=end, validation=validation, source=source)
    age = np.arange(data.n_train)[::-1]
    return dataclasses.replace(data, w_train=(0.5 ** (age / RECENT_HALF_LIFE)).astype(np.float32))


KINDS = ("har", "recent", "sequence", "direction", "horizons", "panel")


def prepare_kind(panel: pd.DataFrame, kind: str, *, asset: str = DEFAULT_ASSET, split: str = DEFAULT_SPLIT,
                 end: str | None = None, validation: str = DEFAULT_VALIDATION, source: str = "") -> HarData:
    """The data set a zoo model trains on (see `keras_side.zoo`)."""
    if kind == "panel":
        return prepare_panel(panel, split=split, end=end, validation=validation, source=source)
    build = {"har": prepare, "recent": prepare_recent, "sequence": prepare_sequences,
             "direction": prepare_direction, "horizons": prepare_horizons}[kind]
    return build(panel, asset=asset, split=split, end=end, validation=validation, source=source)
