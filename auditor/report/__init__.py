"""What people read: the report context, its renderings, charts, email and chat, chargeback, the
view of one job."""
