"""Pure renderers for the `corepin` command: functions from a Topology (plus data) to text.

`table.render_table`, `tree.render_tree` and `svg.render_svg` read nothing but their arguments;
the subcommands decide where the text goes.
"""
