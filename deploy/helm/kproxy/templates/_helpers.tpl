{{/*
Names and labels. Every helper takes a root-like context: the chart's own `.` or, from a parent
chart that includes the sidecar templates, (dict "Values" .Values.kproxy "Release" .Release).
The chart name is spelled out (not .Chart.Name) so the parent's context gives the same names.
*/}}
{{- define "kproxy.name" -}}
{{- default "kproxy" .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "kproxy.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default "kproxy" .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "kproxy.selectorLabels" -}}
app.kubernetes.io/name: {{ include "kproxy.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/* The recommended labels (helm create's, Kubernetes' app.kubernetes.io/*). */}}
{{- define "kproxy.labels" -}}
{{ include "kproxy.selectorLabels" . }}
{{- with .Chart }}
helm.sh/chart: {{ printf "%s-%s" .Name .Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- with .AppVersion }}
app.kubernetes.io/version: {{ . | trunc 63 | trimSuffix "-" | quote }}
{{- end }}
{{- end }}
app.kubernetes.io/component: {{ .Values.mode }}
app.kubernetes.io/managed-by: {{ .Release.Service | default "Helm" }}
app.kubernetes.io/part-of: kproxy
{{- end }}

{{/*
The Secret the API listener's certificate is read from: tls.secretName, else (outside sidecar
mode, unless tls.allowPlaintext) the one the chart makes, <fullname>-tls, from tls.generate
(selfSigned: templates/tls.yaml; certManager: a cert-manager Certificate). Empty: plain HTTP.
*/}}
{{- define "kproxy.tlsSecretName" -}}
{{- if .Values.tls.secretName -}}
{{- .Values.tls.secretName -}}
{{- else if and (ne .Values.mode "sidecar") (not .Values.tls.allowPlaintext) (ne (.Values.tls.generate | default "none") "none") -}}
{{- printf "%s-tls" (include "kproxy.fullname" .) -}}
{{- end -}}
{{- end }}

{{/* The names clients use for the Service, which the generated certificate is valid for. */}}
{{- define "kproxy.serviceDNSNames" -}}
{{- $name := include "kproxy.fullname" . -}}
{{- $ns := .Release.Namespace -}}
{{- toYaml (list $name (printf "%s.%s" $name $ns) (printf "%s.%s.svc" $name $ns) (printf "%s.%s.svc.%s" $name $ns (.Values.tls.clusterDomain | default "cluster.local"))) -}}
{{- end }}

{{/* Whether the sidecar runs as a native sidecar (an init container with restartPolicy: Always). */}}
{{- define "kproxy.nativeSidecar" -}}
{{- $native := toString (dig "native" "auto" (.Values.sidecar | default dict)) -}}
{{- if eq $native "auto" -}}
{{- if semverCompare ">=1.29.0-0" .Capabilities.KubeVersion.Version }}true{{ end -}}
{{- else if eq $native "true" -}}true
{{- end -}}
{{- end }}

{{- define "kproxy.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "kproxy.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "kproxy.image" -}}
{{- $appVersion := "" -}}
{{- if hasKey . "Chart" }}{{ $appVersion = .Chart.AppVersion }}{{ end -}}
{{- $tag := .Values.image.tag | default $appVersion | required "image.tag: set it (a parent chart's context has no kproxy appVersion)" -}}
{{- if .Values.image.digest -}}
{{ .Values.image.repository }}@{{ .Values.image.digest }}
{{- else -}}
{{ .Values.image.repository }}:{{ $tag }}
{{- end -}}
{{- end }}

{{/*
The kproxy config as YAML: chart-derived listeners (and TLS files) under the user's `config:`.
A sidecar listens on loopback only (its app reaches it on localhost); the other modes on every
address, since clients come through a Service. The admin listener is on every address (the
kubelet's probes come from the node), so kproxy authorizes /metrics (metrics_access: auto), and
with TLS it serves the admin listener with the same certificate (admin_tls), so scrapers'
tokens do not cross the network in clear.
*/}}
{{- define "kproxy.config" -}}
{{- $host := ternary "127.0.0.1" "0.0.0.0" (eq .Values.mode "sidecar") -}}
{{- $base := dict "listen" (printf "%s:%d" $host (int .Values.ports.proxy)) "admin_listen" (printf "0.0.0.0:%d" (int .Values.ports.admin)) -}}
{{- if include "kproxy.tlsSecretName" . -}}
{{- $tls := dict "cert_file" "/etc/kproxy-tls/tls.crt" "key_file" "/etc/kproxy-tls/tls.key" -}}
{{- if .Values.tls.clientCASecretName -}}
{{- $_ := set $tls "client_ca_file" "/etc/kproxy-client-ca/ca.crt" -}}
{{- end -}}
{{- $_ := set $base "tls" $tls -}}
{{- $_ := set $base "admin_tls" true -}}
{{- end -}}
{{- toYaml (mergeOverwrite $base (deepCopy (.Values.config | default dict))) -}}
{{- end }}

{{- define "kproxy.configChecksum" -}}
{{- include "kproxy.config" . | sha256sum -}}
{{- end }}

{{/* HTTPS when the rendered config serves the admin listener over TLS, else HTTP (probes, ServiceMonitor). */}}
{{- define "kproxy.adminScheme" -}}
{{- ternary "HTTPS" "HTTP" (eq (toString (include "kproxy.config" . | fromYaml).admin_tls) "true") -}}
{{- end }}

{{/*
"true" when kproxy asks for an authorized bearer token on /metrics (kproxy/config.py
metrics_authorized): metrics_access authorized, or auto with an admin listener off loopback.
*/}}
{{- define "kproxy.metricsAuthorized" -}}
{{- $cfg := include "kproxy.config" . | fromYaml -}}
{{- $access := $cfg.metrics_access | default "auto" -}}
{{- $host := regexReplaceAll ":[0-9]+$" (toString $cfg.admin_listen) "" | trimAll "[]" -}}
{{- $loopback := or (eq $host "localhost") (hasPrefix "127." $host) (eq $host "::1") -}}
{{- if or (eq $access "authorized") (and (eq $access "auto") (not $loopback)) }}true{{ end -}}
{{- end }}

{{/* The credentials mode the rendered config asks for (kproxy's default is proxy). */}}
{{- define "kproxy.credentials" -}}
{{- (include "kproxy.config" . | fromYaml).credentials | default "proxy" -}}
{{- end }}

{{/*
Refuse combinations that are unsafe or cannot work, at render time, with the fix in the message.
*/}}
{{- define "kproxy.validate" -}}
{{- $cfg := include "kproxy.config" . | fromYaml -}}
{{- $creds := $cfg.credentials | default "proxy" -}}
{{- if ne .Values.mode "sidecar" -}}
{{- if and (eq $creds "proxy") (not $cfg.allow_remote) -}}
{{- fail "config.credentials: proxy serves every caller with kproxy's own rights; behind a Service that needs config.allow_remote: true (or use credentials: forward)" -}}
{{- end -}}
{{- if and (eq $creds "proxy") (not (dig "proxy" "accept_hosts" "" $cfg)) (not (dig "proxy" "disable_filter" false $cfg)) -}}
{{- fail "config.credentials: proxy answers 403 to a request naming a host other than localhost, 127.0.0.1 or [::1] (as kubectl proxy does); behind a Service set config.proxy.accept_hosts to the names callers use" -}}
{{- end -}}
{{- if and .Values.tls.clientCASecretName (or (ne $creds "impersonate") (not (include "kproxy.tlsSecretName" .))) -}}
{{- fail "tls.clientCASecretName: client certificates identify callers only with config.credentials: impersonate, over TLS (tls.secretName or tls.generate)" -}}
{{- end -}}
{{- if and .Values.autoscaling.enabled (gt (int .Values.autoscaling.minReplicas) (int .Values.autoscaling.maxReplicas)) -}}
{{- fail "autoscaling.minReplicas is greater than autoscaling.maxReplicas" -}}
{{- end -}}
{{- if and (eq $creds "forward") (not (include "kproxy.tlsSecretName" .)) (not .Values.tls.allowPlaintext) -}}
{{- fail "config.credentials: forward sends callers' bearer tokens, which kubectl and client-go send only over TLS: set tls.secretName (a kubernetes.io/tls Secret) or tls.generate (selfSigned, certManager), or tls.allowPlaintext: true" -}}
{{- end -}}
{{- if and (eq (.Values.tls.generate | default "none") "certManager") (not .Values.tls.secretName) (not (dig "certManager" "issuerRef" "name" "" .Values.tls)) -}}
{{- fail "tls.generate: certManager needs tls.certManager.issuerRef.name (an Issuer or ClusterIssuer of cert-manager)" -}}
{{- end -}}
{{- end -}}
{{- if .Values.persistence.enabled -}}
{{- if ne .Values.mode "daemonset" -}}
{{- fail "persistence.enabled: the watch cache is kept on disk in daemonset mode only (a gateway keeps it in memory)" -}}
{{- end -}}
{{- $dir := "" -}}
{{- range ($cfg.filters | default list) -}}
{{- if eq (toString .name) "watchcache" -}}{{- $dir = dig "persist" "dir" "" . -}}{{- end -}}
{{- end -}}
{{- if ne $dir .Values.persistence.mountPath -}}
{{- fail (printf "persistence.enabled: set the watchcache filter's persist.dir to persistence.mountPath (%s)" .Values.persistence.mountPath) -}}
{{- end -}}
{{- end -}}
{{- /* What kproxy checks across keys (kproxy/config.py parse_config, Config._unique_names), which values.schema.json cannot. */ -}}
{{- $seen := dict -}}
{{- range $i, $f := ($cfg.filters | default list) -}}
{{- if hasKey $seen (toString $f.name) -}}
{{- fail (printf "config.filters[%d]: filter %q is listed twice" $i (toString $f.name)) -}}
{{- end -}}
{{- $_ := set $seen (toString $f.name) true -}}
{{- end -}}
{{- $privileged := dig "impersonate" "allowed_privileged_groups" list $cfg -}}
{{- range $g := (.Values.rbac.impersonateGroups | default list) -}}
{{- if and (or (has $g (list "system:masters" "system:nodes" "system:serviceaccounts:kube-system" "kubeadm:cluster-admins" "system:bootstrappers")) (hasPrefix "system:bootstrappers:" $g)) (not (has $g $privileged)) -}}
{{- fail (printf "rbac.impersonateGroups: %q is a privileged group kproxy refuses to impersonate; list it in config.impersonate.allowed_privileged_groups too if callers in it must be served" $g) -}}
{{- end -}}
{{- end -}}
{{- if and (ne $creds "proxy") (hasKey $cfg "proxy") -}}
{{- fail "config.proxy: applies only with config.credentials: proxy (in the other modes each caller's own credentials reach the apiserver)" -}}
{{- end -}}
{{- end }}

{{/*
The projected service-account volume, mounted into the kproxy container only: the pod itself
does not automount a token, so in sidecar mode the app container has no API credentials and
must go through kproxy. Same files as the kubelet's automount (token, ca.crt, namespace), and
the kubelet rotates the token, which kproxy re-reads.
*/}}
{{- define "kproxy.volumes" -}}
- name: kproxy-config
  configMap:
    name: {{ include "kproxy.fullname" . }}
- name: kproxy-token
  projected:
    defaultMode: 0444
    sources:
      - serviceAccountToken:
          path: token
          expirationSeconds: 3607
      - configMap:
          name: kube-root-ca.crt
          items:
            - key: ca.crt
              path: ca.crt
      - downwardAPI:
          items:
            - path: namespace
              fieldRef:
                fieldPath: metadata.namespace
- name: kproxy-tmp
  emptyDir:
    sizeLimit: 64Mi
{{- with include "kproxy.tlsSecretName" . }}
- name: kproxy-tls
  secret:
    secretName: {{ . }}
    items:
      - key: tls.crt
        path: tls.crt
      - key: tls.key
        path: tls.key
{{- end }}
{{- if .Values.tls.clientCASecretName }}
- name: kproxy-client-ca
  secret:
    secretName: {{ .Values.tls.clientCASecretName }}
    items:
      - key: ca.crt
        path: ca.crt
{{- end }}
{{- if include "kproxy.persistence" . }}
- name: kproxy-state
  hostPath:
    path: {{ .Values.persistence.hostPath }}
    type: DirectoryOrCreate
{{- if .Values.persistence.keySecretName }}
- name: kproxy-persist-key
  secret:
    secretName: {{ .Values.persistence.keySecretName }}
    defaultMode: 0400
    items:
      - key: key
        path: key
{{- end }}
{{- end }}
{{- end }}

{{- define "kproxy.container" -}}
- name: kproxy
  image: {{ include "kproxy.image" . | quote }}
  imagePullPolicy: {{ .Values.image.pullPolicy }}
  args: ["run", "--config", "/etc/kproxy/kproxy.yaml"]
  {{- with .Values.extraEnv }}
  env:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  ports:
    - name: kproxy-api
      containerPort: {{ .Values.ports.proxy }}
      protocol: TCP
    - name: kproxy-admin
      containerPort: {{ .Values.ports.admin }}
      protocol: TCP
  # Ready = kproxy listening, its filters started and the apiserver's /readyz answering 200
  # (docs/deployment.md, "Readiness"). As a native sidecar the app starts only after this passes.
  startupProbe:
    httpGet:
      path: /readyz
      port: kproxy-admin
      scheme: {{ include "kproxy.adminScheme" . }}
    {{- toYaml .Values.probes.startup | nindent 4 }}
  livenessProbe:
    httpGet:
      path: /livez
      port: kproxy-admin
      scheme: {{ include "kproxy.adminScheme" . }}
    {{- toYaml .Values.probes.liveness | nindent 4 }}
  readinessProbe:
    httpGet:
      path: /readyz
      port: kproxy-admin
      scheme: {{ include "kproxy.adminScheme" . }}
    {{- toYaml .Values.probes.readiness | nindent 4 }}
  {{- if .Values.preStopSleepSeconds }}
  # Keep serving while the endpoints controller and kube-proxy (or the app, in a sidecar) stop
  # sending new requests; then SIGTERM, and kproxy drains within config.shutdown_timeout.
  lifecycle:
    preStop:
      exec:
        command: ["sleep", {{ .Values.preStopSleepSeconds | int | toString | quote }}]
  {{- end }}
  {{- with .Values.resources }}
  resources:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  securityContext:
    {{- toYaml .Values.securityContext | nindent 4 }}
  volumeMounts:
    - name: kproxy-config
      mountPath: /etc/kproxy
      readOnly: true
    - name: kproxy-token
      mountPath: /var/run/secrets/kubernetes.io/serviceaccount
      readOnly: true
    - name: kproxy-tmp
      mountPath: /tmp
    {{- if include "kproxy.tlsSecretName" . }}
    - name: kproxy-tls
      mountPath: /etc/kproxy-tls
      readOnly: true
    {{- end }}
    {{- if .Values.tls.clientCASecretName }}
    - name: kproxy-client-ca
      mountPath: /etc/kproxy-client-ca
      readOnly: true
    {{- end }}
    {{- if include "kproxy.persistence" . }}
    - name: kproxy-state
      mountPath: {{ .Values.persistence.mountPath }}
    {{- if .Values.persistence.keySecretName }}
    - name: kproxy-persist-key
      mountPath: /etc/kproxy-persist
      readOnly: true
    {{- end }}
    {{- end }}
{{- end }}

{{/* Non-empty when the watch cache is kept on the node's disk (daemonset mode only). */}}
{{- define "kproxy.persistence" -}}
{{- if and (eq .Values.mode "daemonset") .Values.persistence.enabled -}}true{{- end -}}
{{- end }}

{{/* The pod spec of the gateway Deployment and the node-local DaemonSet. */}}
{{- define "kproxy.podTemplate" -}}
metadata:
  labels:
    {{- include "kproxy.labels" . | nindent 4 }}
    {{- with .Values.podLabels }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
  annotations:
    {{- if .Values.restartOnConfigChange }}
    checksum/config: {{ include "kproxy.configChecksum" . }}
    {{- end }}
    {{- with .Values.podAnnotations }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
spec:
  serviceAccountName: {{ include "kproxy.serviceAccountName" . }}
  automountServiceAccountToken: false
  enableServiceLinks: false
  terminationGracePeriodSeconds: {{ .Values.terminationGracePeriodSeconds }}
  {{- with .Values.priorityClassName }}
  priorityClassName: {{ . }}
  {{- end }}
  {{- with .Values.imagePullSecrets }}
  imagePullSecrets:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  securityContext:
    {{- toYaml .Values.podSecurityContext | nindent 4 }}
  {{- if include "kproxy.persistence" . }}
  initContainers:
    # The hostPath directory as kubelet makes it is root's, 0755: make it kproxy's, 0700.
    - name: kproxy-state-dir
      image: {{ include "kproxy.image" . | quote }}
      imagePullPolicy: {{ .Values.image.pullPolicy }}
      command:
        - python
        - -c
        - |
          import os, sys
          d, uid, gid = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
          os.chown(d, uid, gid)
          os.chmod(d, 0o700)
        - {{ .Values.persistence.mountPath | quote }}
        - {{ .Values.podSecurityContext.runAsUser | default 65532 | int | toString | quote }}
        - {{ .Values.podSecurityContext.runAsGroup | default 65532 | int | toString | quote }}
      securityContext:
        runAsUser: 0
        runAsNonRoot: false
        readOnlyRootFilesystem: true
        allowPrivilegeEscalation: false
        capabilities:
          drop: [ALL]
          add: [CHOWN, FOWNER]
        seccompProfile:
          type: RuntimeDefault
      volumeMounts:
        - name: kproxy-state
          mountPath: {{ .Values.persistence.mountPath }}
  {{- end }}
  containers:
    {{- include "kproxy.container" . | nindent 4 }}
  volumes:
    {{- include "kproxy.volumes" . | nindent 4 }}
  {{- with .Values.nodeSelector }}
  nodeSelector:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with .Values.affinity }}
  affinity:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with .Values.tolerations }}
  tolerations:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- if eq .Values.mode "gateway" }}
  topologySpreadConstraints:
    {{- if .Values.topologySpreadConstraints }}
    {{- toYaml .Values.topologySpreadConstraints | nindent 4 }}
    {{- else }}
    - maxSkew: 1
      topologyKey: topology.kubernetes.io/zone
      whenUnsatisfiable: ScheduleAnyway
      labelSelector:
        matchLabels:
          {{- include "kproxy.selectorLabels" . | nindent 10 }}
    - maxSkew: 1
      topologyKey: kubernetes.io/hostname
      whenUnsatisfiable: ScheduleAnyway
      labelSelector:
        matchLabels:
          {{- include "kproxy.selectorLabels" . | nindent 10 }}
    {{- end }}
  {{- end }}
{{- end }}
