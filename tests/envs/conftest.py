import pytest

from roll_ma.envs.math_verification import MathVerifier


@pytest.fixture(scope="session")
def verifier():
    v = MathVerifier(timeout_s=2.0)
    yield v
    v.close()
