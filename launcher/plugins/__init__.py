"""The in-tree plugins: model families that are not SD 1.x or SD 2.0, each one package of its own,
built as a plugin from outside the checkout is (docs/adding-a-family.md): `family.py` holds its `FAMILY`,
`stage.py` (where it has one) its `STAGE`, `conf/` its conf groups. launcher.discovery finds them by
listing this folder; nothing else names them."""
