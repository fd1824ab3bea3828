"""The test suite's chi-square helper is the library's (one definition): `specdec.exactness.stats`."""

from specdec.exactness.stats import ChiSquare, chi2_pvalue, chi_square  # noqa: F401
