"""ledger: allocations keyed by job instance (Slurm reuses job ids); reservations remember Slurm's id

Revision ID: 0003_ledger
Revises: 0002
Create Date: 2026-11-30
"""
import sqlalchemy as sa
from alembic import op

revision = "0003_ledger"
down_revision = "0002"
branch_labels = None
depends_on = None

INSTANCE_COMMENT = (
    "Which job of that id: the submit time (UTC epoch seconds; the start time when the scheduler gave no "
    "submit time) at the first sighting; 0 for Kubernetes pods (a UID is never reused). A later sighting is "
    "the same job when its submit time equals the stored one, or, if either lacks a submit time, when the "
    "start times are equal; a sighting with neither time belongs to the latest job of that id. See "
    "docs/slurm.md \"Job ids\".")
EXTERNAL_COMMENT = ("Scheduler id: Slurm job id (array/het part included) or Kubernetes pod UID. Slurm reuses "
                    "job ids (wrap-around, state loss): instance_ts tells those jobs apart.")
SLURM_ID_COMMENT = (
    "Slurm's reservation id (sacctmgr ID, the ReservationId of jobs) when known. Identity: one row per "
    "reservation, with its latest definition: a sighting with the same name and the same slurm_id, or (id "
    "unknown on either side) an overlapping or touching span, or both still current when seen, replaces the "
    "stored definition.")
RESV_COMMENT = ("Slurm advance reservations, one row per reservation (pieces that sacctmgr keeps per "
                "modification are assembled into one; a moved start or end replaces the old definition).")


def upgrade() -> None:
    with op.batch_alter_table("allocations", schema=None) as batch_op:
        batch_op.add_column(sa.Column("instance_ts", sa.Integer(), server_default="0", nullable=False,
                                      comment=INSTANCE_COMMENT))
        batch_op.alter_column("external_id", existing_type=sa.String(length=255), existing_nullable=False,
                              comment=EXTERNAL_COMMENT)
        batch_op.drop_constraint("uq_allocations_cluster_source_external_id", type_="unique")
        batch_op.create_unique_constraint("uq_allocations_cluster_source_external_id_instance_ts",
                                          ["cluster", "source", "external_id", "instance_ts"])
    # stored jobs were unique per id already; give them the instance a new sighting would get
    op.execute("UPDATE allocations SET instance_ts = COALESCE(submit_ts, start_ts, 0) "
               "WHERE source <> 'kubernetes'")
    with op.batch_alter_table("reservations", schema=None) as batch_op:
        batch_op.add_column(sa.Column("slurm_id", sa.String(length=64), nullable=True, comment=SLURM_ID_COMMENT))
        batch_op.alter_column("start_ts", existing_type=sa.Integer(), existing_nullable=False,
                              comment="Reservation start (the earliest piece when accounting split it on "
                                      "updates) (UTC epoch seconds)")
        batch_op.alter_column("end_ts", existing_type=sa.Integer(), existing_nullable=False,
                              comment="Reservation end (the latest piece's end) (UTC epoch seconds)")
    if op.get_bind().dialect.name != "sqlite":  # SQLite keeps no comments
        op.create_table_comment("reservations", RESV_COMMENT, existing_comment="Slurm advance reservations.")


def downgrade() -> None:
    if op.get_bind().dialect.name != "sqlite":
        op.create_table_comment("reservations", "Slurm advance reservations.", existing_comment=RESV_COMMENT)
    with op.batch_alter_table("reservations", schema=None) as batch_op:
        batch_op.alter_column("end_ts", existing_type=sa.Integer(), existing_nullable=False,
                              comment="Reservation end (UTC epoch seconds)")
        batch_op.alter_column("start_ts", existing_type=sa.Integer(), existing_nullable=False,
                              comment="Reservation start (UTC epoch seconds)")
        batch_op.drop_column("slurm_id")
    # a reused job id cannot fit the old key: keep the latest job of each id
    op.execute("DELETE FROM allocations WHERE id NOT IN (SELECT MAX(id) FROM allocations "
               "GROUP BY cluster, source, external_id)")
    with op.batch_alter_table("allocations", schema=None) as batch_op:
        batch_op.drop_constraint("uq_allocations_cluster_source_external_id_instance_ts", type_="unique")
        batch_op.create_unique_constraint("uq_allocations_cluster_source_external_id",
                                          ["cluster", "source", "external_id"])
        batch_op.alter_column("external_id", existing_type=sa.String(length=255), existing_nullable=False,
                              comment="Scheduler id: Slurm job id (array/het part included) or Kubernetes "
                                      "pod UID.")
        batch_op.drop_column("instance_ts")
