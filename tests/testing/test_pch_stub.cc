// Owner of the unit tests' precompiled header (tests/testing/test_pch.h); every test reuses it.
int main() { return 0; }
