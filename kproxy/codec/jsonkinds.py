"""What both JSON writers (``tojson``'s upb path and ``wirejson``'s wire path) know about kinds:
list kinds, nested TypeMeta the apiserver defaults in, and the message types worth memoising."""

from __future__ import annotations

from .schema import MessagePlan

# Nested objects whose TypeMeta the apiserver fills by defaulting on every read, so its JSON
# shows them although protobuf (which never carries a nested TypeMeta) cannot:
# apps SetDefaults_StatefulSet sets the volumeClaimTemplates' apiVersion/kind.
NESTED_TYPE_META = {
    (f"k8s.io.api.apps.{v}.StatefulSetSpec", "volumeClaimTemplates"): ("PersistentVolumeClaim", "v1")
    for v in ("v1", "v1beta1", "v1beta2")
}


# Message types whose JSON is memoised in to_json (by their protobuf bytes): sub-objects that
# replicas of one workload share and that cost several calls to encode. Toleration, VolumeMount,
# ContainerPort and EnvVarSource (valueFrom) have many optional fields, so a serialisation is
# cheaper than their HasField/getattr visits (measured +5-7% on the pod list); EnvVar (two
# strings, its value unique per pod as often as not) is left out: hashing it costs what it saves.
MEMO_TYPES = frozenset(
    {
        "Container",
        "Toleration",
        "VolumeMount",
        "ContainerPort",
        "EnvVarSource",
        "ManagedFieldsEntry",
        "Probe",
        "Volume",
        "SecurityContext",
        "PodSecurityContext",
        "Affinity",
        "ResourceRequirements",
        "PodCondition",
        "TopologySpreadConstraint",
    }
)


def is_list_kind(plan: MessagePlan) -> bool:
    """A list kind (TypeMeta and a ListMeta `metadata`)."""
    return plan.has_type_meta and any(
        f.json == "metadata" and f.proto.message_type is not None and f.proto.message_type.name == "ListMeta"
        for f in plan.fields
    )
