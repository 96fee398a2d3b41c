"""Pure renderers for the `corepin` command: functions from a Topology or a command's data to
text.

`table.render_table`, `tree.render_tree` and `svg.render_svg` (its tree of boxes:
`boxes`) draw a machine; `report.render_report` draws `corepin report`, `shield` what `corepin
shield` prints. They read nothing but their arguments; the subcommands decide where the text
goes.
"""
