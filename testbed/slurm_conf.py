"""The throwaway Slurm cluster's configuration files (testbed/slurm_cluster.py fills them in):
`slurm.conf` for a single node with two partitions and fake GPUs, `oci.conf` for steps in
containers, and the accounting behind it (testbed/slurm_accounting.py): `slurmdbd.conf` and the
MariaDB server's own option file. testbed/slurm_multinode.py builds its four-node cluster on the
same `slurm.conf`, without accounting (`NO_ACCOUNTING`)."""

SLURM_CONF = """\
# Written by testbed/slurm_cluster.py: a throwaway single-node cluster, nothing shared.
ClusterName=sinewgrid-test
SlurmctldHost={host}(127.0.0.1)
SlurmctldPort={ctld_port}
SlurmdPort={slurmd_port}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={munge_socket}
StateSaveLocation={root}/state
SlurmdSpoolDir={root}/spool
SlurmctldPidFile={root}/run/slurmctld.pid
SlurmdPidFile={root}/run/slurmd.pid
SlurmctldLogFile={root}/log/slurmctld.log
SlurmdLogFile={root}/log/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
# No cgroups here: processes are tracked by parentage, tasks are not confined.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
SelectType=select/cons_tres
# Cores only: memory is not a consumable resource, so jobs need not ask for it.
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
SchedulerParameters=bf_interval=2,sched_interval=2
{accounting}
# Finished jobs stay visible to `scontrol show job` for MinJobAge seconds, and
# `sacct --completion` reads the job completion file after that.
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/filetxt
JobCompLoc={root}/log/jobcomp.txt
MinJobAge=600
KillWait=5
JobRequeue=1
ReturnToService=2
InactiveLimit=0
SlurmctldTimeout=30
SlurmdTimeout=30
GresTypes=gpu
PreemptType=preempt/partition_prio
PreemptMode=REQUEUE
NodeName={node} NodeHostname={host} NodeAddr=127.0.0.1 CPUs={cpus} Gres=gpu:{gpus} State=UNKNOWN
PartitionName=gpu Nodes={node} Default=YES MaxTime=INFINITE State=UP PriorityTier=10 PreemptMode=OFF
PartitionName=spot Nodes={node} MaxTime=INFINITE State=UP PriorityTier=1 PreemptMode=REQUEUE
"""

# Accounting through slurmdbd: the associations (an account per team and its users), the QOS
# (one per priority class) and the usage that the multifactor priority's fair share reads
# (docs/queues_slurm.md). Enforced: a job needs an association (the cluster's start makes
# `sinewgrid` its users' default account), may ask only for its association's QOS, within its
# limits (GrpTRES=gres/gpu=N). Usage decays fast here (half-life 10 minutes), as a test wants.
SLURMDBD_ACCOUNTING = """\
# Accounts, QOS and fair share: slurmdbd and its MariaDB in this folder (docs/queues_slurm.md).
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=127.0.0.1
AccountingStoragePort={dbd_port}
# The munge socket the clients (sacctmgr, sshare, sacct) authenticate to slurmdbd with: this cluster's.
AccountingStoragePass={munge_socket}
AccountingStorageEnforce=associations,limits,qos
AccountingStorageTRES=gres/gpu
PriorityType=priority/multifactor
PriorityWeightFairshare=10000
PriorityWeightQOS=10000
PriorityDecayHalfLife=00:10:00
PriorityCalcPeriod=1"""

# Without slurmdbd: no associations, no QOS, no fair share (jobs run in the order they came).
NO_ACCOUNTING = """\
# No accounting: no associations, QOS or fair share.
AccountingStorageType=accounting_storage/none
PriorityType=priority/basic"""

SLURMDBD_CONF = """\
# Written by testbed/slurm_cluster.py: the cluster's accounting daemon, its database the
# MariaDB server of this folder (MARIADB_CNF). slurmdbd reads it beside slurm.conf; mode 600.
AuthType=auth/munge
AuthInfo=socket={munge_socket}
DbdHost={host}
DbdAddr=127.0.0.1
DbdPort={dbd_port}
SlurmUser=root
PidFile={root}/run/slurmdbd.pid
LogFile={root}/log/slurmdbd.log
DebugLevel=info
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort={db_port}
StorageUser=root
StorageLoc=slurm_acct_db
"""

# A throwaway MariaDB for slurmdbd: its data, socket and port of its own, run as root, small and
# unsynced (a test database). slurmdbd warns that the buffer pool and log file are smaller than
# it recommends for a site; the test cluster's few jobs need no more.
MARIADB_CNF = """\
# Written by testbed/slurm_cluster.py: the accounting database of one throwaway cluster.
[mariadbd]
user=root
datadir={root}/db/data
socket={root}/db/mariadb.sock
port={db_port}
bind-address=127.0.0.1
pid-file={root}/run/mariadb.pid
log-error={root}/log/mariadb.log
skip-name-resolve
skip-log-bin
performance_schema=OFF
innodb_buffer_pool_size=64M
innodb_log_file_size=8M
innodb_flush_log_at_trx_commit=0
innodb_lock_wait_timeout=900
"""

# Slurm's own OCI containers (`srun --container=BUNDLE`): runc, rootless, as the job's user, with
# its state under the cluster's folder (one folder per user; 22.05 has no uid pattern). The
# patterns: %n node, %u user, %j job, %s step, %t task, %b the bundle Slurm prepared.
OCI_CONF = """\
# Written by testbed/slurm_cluster.py: steps in containers with runc (deploy/slurm/README.md).
RunTimeQuery="runc --rootless=true --root={runc_root}/%u state %n.%u.%j.%s.%t"
RunTimeRun="runc --rootless=true --root={runc_root}/%u run --bundle %b %n.%u.%j.%s.%t"
RunTimeKill="runc --rootless=true --root={runc_root}/%u kill -a %n.%u.%j.%s.%t SIGTERM"
RunTimeDelete="runc --rootless=true --root={runc_root}/%u delete --force %n.%u.%j.%s.%t"
"""
