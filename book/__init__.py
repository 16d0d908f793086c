"""The course as a static website (`make book`): the notebooks executed, the docs, the reference's
source and the blank exercises, built offline with Sphinx + myst-nb (docs/design.md says why)."""
