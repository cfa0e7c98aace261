"""Ships the Metal kernel sources of the top-level ``kernels/`` folder inside the package, as
``rnngrad._kernels``; everything else is configured in pyproject.toml."""

from setuptools import find_packages, setup

setup(
    packages=find_packages(include=["rnngrad", "rnngrad.*"]) + ["rnngrad._kernels"],
    package_dir={"rnngrad._kernels": "kernels"},
    package_data={"rnngrad._kernels": ["*.metal", "*.h"]},
)
