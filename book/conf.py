"""Sphinx's settings for the book (book/build.py stages the pages, then runs Sphinx with these).

Offline by construction: the theme's scripts, styles and fonts are in the package; MathJax comes
from sphinx-mathjax-offline (copied into _static/mathjax); Vega from vl-convert (build.stage
writes _static/vega-bundle.js). The notebooks arrive executed (book/execute.py), so myst-nb
executes nothing.
"""

project = "diloco_lite"
author = "the diloco_lite authors"
copyright = "the diloco_lite authors, MIT license"
html_title = "diloco_lite: low-communication training, by hand"

extensions = ["myst_nb", "sphinx-mathjax-offline"]
exclude_patterns = ["_build", "**.ipynb_checkpoints"]
suppress_warnings = ["myst.header"]  # a notebook's title is its only level-1 heading

# myst-nb: notebooks as they come (executed by book/execute.py; the exercises stay blank)
nb_execution_mode = "off"
nb_merge_streams = True
nb_output_stderr = "show"
myst_enable_extensions = ["dollarmath", "amsmath", "colon_fence", "html_image", "html_admonition"]
myst_heading_anchors = 4  # GitHub's anchors: the docs link to "algorithms.md#symbols"
myst_dmath_double_inline = True

html_theme = "sphinx_book_theme"
html_theme_options = {
    "repository_url": "https://github.com/diloco-lite/diloco_lite",
    "use_repository_button": True,
    "show_toc_level": 2,
    "navigation_with_keys": False,
}
html_context = {"default_mode": "light"}  # none: the theme logs "invalid theme mode"
html_static_path = ["_static"]
html_extra_path = ["_extra"]
html_js_files = ["vega-bundle.js"]
html_css_files = ["book.css"]
html_show_sourcelink = False
