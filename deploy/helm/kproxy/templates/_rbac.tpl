{{/*
The service account's rules, computed from the rendered config (docs/security.md):

- each `watchcache` filter: get, list and watch on its `resources` (the cache lists and watches
  them with kproxy's own credentials), in the filter's own forms: "pods" (a bare name is granted
  in the core group: write other groups' resources as RESOURCE.GROUP), "deployments.apps",
  "apps/v1/deployments", "v1/pods", or "*" (every resource: get, list and watch on everything,
  which is what following every resource needs). With `persist`: get on the namespace
  kube-system (resourceNames), whose UID names the cluster a persisted state belongs to.
- credentials forward or impersonate: create on tokenreviews (who is the caller) and
  subjectaccessreviews (may the caller see what the cache would serve; in impersonate mode,
  is the caller a cluster administrator kproxy must not act as).
- credentials impersonate: impersonate on users, groups, serviceaccounts, uids and
  userextras/<key> for each of rbac.impersonateExtras (RBAC has no wildcard for subresources)
  kproxy acts as each caller. With rbac.impersonateGroups, impersonate on groups is
  granted for exactly those groups (and system:authenticated, which every authenticated caller
  has): the apiserver then refuses kproxy any other group, system:masters included. RBAC only
  grants, so without that list kproxy's own refusal (config.impersonate.allowed_privileged_*)
  is what keeps system:masters out.
- /metrics authorized (the admin listener off loopback, kproxy's default there): create on
  tokenreviews and subjectaccessreviews, to ask who a scraper is and whether it may get /metrics.
- a `validation` filter: get on /openapi/v2 and /openapi/v3/* (the schemas it validates with);
  with `watch_crds` (default true) get, list and watch on customresourcedefinitions (it notices
  schema changes); with `local_strict` (default true) create on subjectaccessreviews (it asks
  whether the caller may make the write before answering a strict-validation error itself).
- the dry-run, compression and transcode filters need nothing of their own.
- rbac.extraRules, verbatim (in proxy mode: whatever every caller may do).
*/}}
{{- define "kproxy.rbacRules" -}}
{{- $cfg := include "kproxy.config" . | fromYaml -}}
{{- $creds := $cfg.credentials | default "proxy" -}}
{{- $filters := $cfg.filters | default list -}}
{{- $rules := list -}}
{{- $readable := dict -}}
{{- $tokenReviews := or (eq $creds "forward") (eq $creds "impersonate") -}}
{{- if include "kproxy.metricsAuthorized" . -}}
{{- $tokenReviews = true -}}
{{- end -}}
{{- $accessReviews := $tokenReviews -}}
{{- $openapi := false -}}
{{- $persist := false -}}
{{- range $f := $filters -}}
{{- if eq $f.name "watchcache" -}}
{{- if $f.persist -}}
{{- $persist = true -}}
{{- end -}}
{{- range $r := ($f.resources | default list) -}}
{{- $group := "" -}}{{- $resource := "" -}}
{{- $slashes := splitList "/" $r -}}
{{- if eq $r "*" -}}
{{- $group = "*" -}}{{- $resource = "*" -}}
{{- else if eq (len $slashes) 3 -}}
{{- $group = index $slashes 0 -}}{{- $resource = index $slashes 2 -}}
{{- else if eq (len $slashes) 2 -}}
{{- $resource = index $slashes 1 -}}
{{- else -}}
{{- $parts := splitn "." 2 $r -}}
{{- $resource = $parts._0 -}}{{- $group = $parts._1 | default "" -}}
{{- end -}}
{{- $_ := set $readable $group (append (get $readable $group | default list) $resource | uniq) -}}
{{- end -}}
{{- else if eq $f.name "validation" -}}
{{- $openapi = true -}}
{{- if ne (toString $f.watch_crds) "false" -}}
{{- $_ := set $readable "apiextensions.k8s.io" (append (get $readable "apiextensions.k8s.io" | default list) "customresourcedefinitions" | uniq) -}}
{{- end -}}
{{- if ne (toString $f.local_strict) "false" -}}
{{- $accessReviews = true -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- range $group := keys $readable | sortAlpha -}}
{{- $rules = append $rules (dict "apiGroups" (list $group) "resources" (get $readable $group | sortAlpha) "verbs" (list "get" "list" "watch")) -}}
{{- end -}}
{{- if $persist -}}
{{- $rules = append $rules (dict "apiGroups" (list "") "resources" (list "namespaces") "resourceNames" (list "kube-system") "verbs" (list "get")) -}}
{{- end -}}
{{- if $tokenReviews -}}
{{- $rules = append $rules (dict "apiGroups" (list "authentication.k8s.io") "resources" (list "tokenreviews") "verbs" (list "create")) -}}
{{- end -}}
{{- if $accessReviews -}}
{{- $rules = append $rules (dict "apiGroups" (list "authorization.k8s.io") "resources" (list "subjectaccessreviews") "verbs" (list "create")) -}}
{{- end -}}
{{- if eq $creds "impersonate" -}}
{{- with .Values.rbac.impersonateGroups -}}
{{- $rules = append $rules (dict "apiGroups" (list "") "resources" (list "users" "serviceaccounts") "verbs" (list "impersonate")) -}}
{{- $rules = append $rules (dict "apiGroups" (list "") "resources" (list "groups") "resourceNames" (append . "system:authenticated" | uniq) "verbs" (list "impersonate")) -}}
{{- else -}}
{{- $rules = append $rules (dict "apiGroups" (list "") "resources" (list "users" "groups" "serviceaccounts") "verbs" (list "impersonate")) -}}
{{- end -}}
{{- $extras := list "uids" -}}
{{- range $k := (.Values.rbac.impersonateExtras | default list) -}}
{{- $extras = append $extras (printf "userextras/%s" $k) -}}
{{- end -}}
{{- $rules = append $rules (dict "apiGroups" (list "authentication.k8s.io") "resources" $extras "verbs" (list "impersonate")) -}}
{{- end -}}
{{- if $openapi -}}
{{- $rules = append $rules (dict "nonResourceURLs" (list "/openapi/v2" "/openapi/v3" "/openapi/v3/*") "verbs" (list "get")) -}}
{{- end -}}
{{- range $r := .Values.rbac.extraRules -}}
{{- $rules = append $rules $r -}}
{{- end -}}
{{- toYaml $rules -}}
{{- end }}
