"""The throwaway Slurm cluster's configuration files (testbed/slurm_cluster.py fills them in):
`slurm.conf` for a single node with two partitions and fake GPUs, and `oci.conf` for steps in
containers. testbed/slurm_multinode.py builds its four-node cluster on the same `slurm.conf`."""

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
# Without slurmdbd: finished jobs stay visible to `scontrol show job` for MinJobAge seconds,
# and `sacct --completion` reads the job completion file after that.
AccountingStorageType=accounting_storage/none
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
