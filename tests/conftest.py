"""Test-wide settings."""

from hypothesis import settings

# No per-example deadline: on a shared 2-core machine one example can take seconds (the first call
# of a lazily imported library, a busy neighbour), and a timing failure there says nothing about
# the property under test. Slowness is measured in benchmarks/, never asserted in tests.
settings.register_profile("fairstream", deadline=None)
settings.load_profile("fairstream")
