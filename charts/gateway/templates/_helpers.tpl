{{- define "gateway.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "gateway.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* Labels of every object but the release's (app.kubernetes.io/instance), which the selector
carries too: each mapping names a key once (kustomize and Flux's post-renderer refuse a mapping
that repeats one). */}}
{{- define "gateway.commonLabels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: svc-gateway
{{- end -}}

{{/* Labels of an object of the release as a whole (a Service of no component, a Secret). */}}
{{- define "gateway.labels" -}}
{{ include "gateway.commonLabels" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{/* Labels of one component's objects: the common ones and its selector. */}}
{{- define "gateway.componentLabels" -}}
{{ include "gateway.commonLabels" .root }}
{{ include "gateway.selector" . }}
{{- end -}}

{{/* Labels of one component's pods: its own, then .podLabels (values) for the keys it does not
set; a podLabels key the selector needs is ignored, so the pods always match it. */}}
{{- define "gateway.podLabels" -}}
{{- $own := include "gateway.componentLabels" . | fromYaml -}}
{{- toYaml (merge $own (.podLabels | default dict)) -}}
{{- end -}}

{{/* Selector labels of one component: gateway, operator, redis, postgres, migrate. */}}
{{- define "gateway.selector" -}}
app.kubernetes.io/name: {{ .component }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
{{- end -}}

{{- define "gateway.image" -}}
{{- if .image.digest -}}
{{- printf "%s@%s" .image.repository .image.digest -}}
{{- else -}}
{{- printf "%s:%s" .image.repository (default .root.Chart.AppVersion .image.tag) -}}
{{- end -}}
{{- end -}}

{{- define "gateway.podSecurityContext" -}}
{{- with .Values.podSecurityContext }}
{{- toYaml . }}
{{- else -}}
runAsNonRoot: true
runAsUser: 65532
runAsGroup: 65532
fsGroup: 65532
seccompProfile:
  type: RuntimeDefault
{{- end }}
{{- end -}}

{{- define "gateway.containerSecurityContext" -}}
{{- with .Values.containerSecurityContext }}
{{- toYaml . }}
{{- else -}}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
runAsNonRoot: true
capabilities:
  drop: ["ALL"]
{{- end }}
{{- end -}}

{{/* The Secret of the URLs the chart writes, owned by the release (uninstall deletes it). Not
FULLNAME-stores, the hook Secret of chart versions before, which Helm would refuse to adopt. */}}
{{- define "gateway.storesSecret" -}}
{{- printf "%s-store-urls" (include "gateway.fullname" .) -}}
{{- end -}}

{{/* Whether the chart writes a store's URL into its own Secret: an in-cluster store, or a URL
given in values; otherwise the URL is in an existing Secret. */}}
{{- define "gateway.redisOwned" -}}
{{- if or .Values.redis.inCluster.enabled .Values.redis.url -}}true{{- end -}}
{{- end -}}

{{- define "gateway.postgresOwned" -}}
{{- if or .Values.postgres.inCluster.enabled .Values.postgres.url -}}true{{- end -}}
{{- end -}}

{{- define "gateway.redisSecretRef" -}}
{{- if include "gateway.redisOwned" . -}}
name: {{ include "gateway.storesSecret" . }}
key: redis-url
{{- else -}}
name: {{ required "redis: set existingSecret, url or inCluster.enabled" .Values.redis.existingSecret }}
key: {{ .Values.redis.existingSecretKey }}
{{- end -}}
{{- end -}}

{{- define "gateway.postgresSecretRef" -}}
{{- if include "gateway.postgresOwned" . -}}
name: {{ include "gateway.storesSecret" . }}
key: database-url
{{- else -}}
name: {{ .Values.postgres.existingSecret }}
key: {{ .Values.postgres.existingSecretKey }}
{{- end -}}
{{- end -}}

{{/* Postgres is optional until the ledger needs it: on when any source is given. */}}
{{- define "gateway.hasPostgres" -}}
{{- if or (include "gateway.postgresOwned" .) .Values.postgres.existingSecret -}}true{{- end -}}
{{- end -}}

{{- define "gateway.adminTokenSecret" -}}
{{- default (printf "%s-admin" (include "gateway.fullname" .)) .Values.gateway.adminTokenSecret -}}
{{- end -}}

{{- define "gateway.responsesSecret" -}}
{{- default (printf "%s-responses" (include "gateway.fullname" .)) .Values.gateway.responsesSecret -}}
{{- end -}}

{{- define "gateway.databaseEnv" -}}
{{- if include "gateway.hasPostgres" . }}
- name: DATABASE_URL
  valueFrom:
    secretKeyRef:
      {{- include "gateway.postgresSecretRef" . | nindent 6 }}
{{- end }}
{{- end -}}

{{/* The stores' URLs, as every gateway container gets them: the database through its pooler
when there is one (migrations keep the direct URL: PgBouncer's transaction pooling cannot run
them). */}}
{{- define "gateway.storeEnv" -}}
- name: REDIS_URL
  valueFrom:
    secretKeyRef:
      {{- include "gateway.redisSecretRef" . | nindent 6 }}
{{- if and .Values.postgres.poolerSecret (include "gateway.hasPostgres" .) }}
- name: DATABASE_URL
  valueFrom:
    secretKeyRef:
      name: {{ .Values.postgres.poolerSecret }}
      key: {{ .Values.postgres.poolerSecretKey }}
- name: GATEWAY_DATABASE_POOLER
  value: transaction
{{- else }}
{{- include "gateway.databaseEnv" . }}
{{- end }}
{{- end -}}

{{/* The migrations' container, in the hook Job or a gateway pod's init containers. The Job
runs before the release's own Secrets exist, so a URL the chart writes reaches it through
.hookSecret, a hook Secret of its own (migrate-job.yaml). */}}
{{- define "gateway.migrateContainer" -}}
{{- $root := .root -}}
name: migrate
image: {{ include "gateway.image" (dict "image" $root.Values.gateway.image "root" $root) }}
imagePullPolicy: {{ $root.Values.gateway.image.pullPolicy }}
args: ["migrate"]
env:
{{- if and .hookSecret (include "gateway.postgresOwned" $root) }}
  - name: DATABASE_URL
    valueFrom:
      secretKeyRef:
        name: {{ .hookSecret }}
        key: database-url
{{- else }}
  {{- include "gateway.databaseEnv" $root | indent 2 }}
{{- end }}
  {{- include "gateway.storeTlsEnv" (dict "root" $root "redis" false) | indent 2 }}
securityContext:
  {{- include "gateway.containerSecurityContext" $root | nindent 2 }}
resources:
  {{- toYaml $root.Values.gateway.resources | nindent 2 }}
{{- /* TLS to the database, and the gateway's own mounts (the same binary). */}}
{{- $tlsMounts := include "gateway.storeTlsMounts" (dict "root" $root "redis" false) | trim }}
{{- if or $tlsMounts $root.Values.gateway.extraVolumeMounts }}
volumeMounts:
  {{- with $tlsMounts }}
  {{- . | nindent 2 }}
  {{- end }}
  {{- with $root.Values.gateway.extraVolumeMounts }}
  {{- toYaml . | nindent 2 }}
  {{- end }}
{{- end }}
{{- end -}}

{{/* Whether the operator owns the gateway Deployment's replicas. Then the chart leaves
spec.replicas out, so `helm upgrade` never resets what the scaler (or `kubectl scale`) set:
Helm's three-way merge only patches fields the chart renders. */}}
{{- define "gateway.operatorScales" -}}
{{- if and .Values.operator.enabled .Values.operator.scaleGateway -}}true{{- end -}}
{{- end -}}

{{/* Names of the operator's Secret and Lease: derived from the release unless set, so two
releases in one namespace do not share them. */}}
{{/* The Secrets the operator reads, as a YAML list: the config Secret, then operator.secrets. */}}
{{- define "gateway.operatorSecrets" -}}
{{- toYaml (uniq (prepend .Values.operator.secrets (include "gateway.configSecret" .))) -}}
{{- end -}}

{{- define "gateway.configSecret" -}}
{{- default (printf "%s-config" (include "gateway.fullname" .)) .Values.operator.configSecret -}}
{{- end -}}

{{- define "gateway.lease" -}}
{{- default (printf "%s-operator" (include "gateway.fullname" .)) .Values.operator.lease -}}
{{- end -}}

{{/* ingress-nginx's settings for LLM traffic, under gateway.ingress.annotations (which win).
The body size is the gateway's largest cap (a Message Batch create, 256 MiB): the gateway
refuses a body over its route's own cap (16 MiB elsewhere under /v1) with 413 before reading it,
so nginx need not know the routes. The timeouts are the longest a turn may run
(--reaper-max-turn-secs, 3600): a non-streamed turn sends nothing until it is done, and nginx's
default (60 s) would cut it, and a stream between two events. Buffering off both ways: a stream's
events reach the client as they come, and a body reaches the gateway's own reader, its caps and
its deadlines, instead of nginx's disk. */}}
{{- define "gateway.nginxAnnotations" -}}
nginx.ingress.kubernetes.io/proxy-body-size: 256m
nginx.ingress.kubernetes.io/proxy-read-timeout: "3600"
nginx.ingress.kubernetes.io/proxy-send-timeout: "3600"
nginx.ingress.kubernetes.io/proxy-buffering: "off"
nginx.ingress.kubernetes.io/proxy-request-buffering: "off"
{{- end -}}

{{/* The proxies the gateway trusts to name the client in X-Forwarded-For: gateway.trustedProxies,
and the networks of the chart's Ingress or HTTPRoute (the controller's pods) while it is on.
Behind a Service that is also a node port or a load balancer, those private ranges would be a
client's too (a balancer that rewrites the source to a node's address), so the chart refuses to
guess: gateway.trustedProxies (null by default) must then be set, [] included. */}}
{{- define "gateway.trustedProxies" -}}
{{- $g := .Values.gateway -}}
{{- $fronted := or $g.ingress.enabled $g.httpRoute.enabled -}}
{{- if and $fronted (has $g.service.type (list "LoadBalancer" "NodePort")) (kindIs "invalid" $g.trustedProxies) -}}
{{- fail (printf "gateway.service.type is %s beside the chart's Ingress or HTTPRoute, whose trusted proxies (gateway.ingress.trustedProxies, gateway.httpRoute.trustedProxies: the private ranges by default) then include the addresses a balancer or node port forwards from, so an internet client could forge X-Forwarded-For: set gateway.trustedProxies explicitly ([] or your proxies), narrow the front end's trustedProxies to the controller's pod CIDR, and prefer gateway.service.externalTrafficPolicy: Local (docs/kubernetes.md, \"Behind the Ingress: the client address\")" $g.service.type) -}}
{{- end -}}
{{- $trusted := default (list) $g.trustedProxies -}}
{{- if $g.ingress.enabled -}}
{{- $trusted = concat $trusted $g.ingress.trustedProxies -}}
{{- end -}}
{{- if $g.httpRoute.enabled -}}
{{- $trusted = concat $trusted $g.httpRoute.trustedProxies -}}
{{- end -}}
{{- join "," (uniq $trusted) -}}
{{- end -}}

{{/* The database URL the chart writes (gateway.postgresOwned): the in-cluster one, or postgres.url. */}}
{{- define "gateway.postgresUrl" -}}
{{- if .Values.postgres.inCluster.enabled -}}
{{- $p := .Values.postgres.inCluster -}}
{{- printf "postgres://%s:%s@%s-postgres:5432/%s" $p.user $p.password (include "gateway.fullname" .) $p.database -}}
{{- else -}}
{{- .Values.postgres.url -}}
{{- end -}}
{{- end -}}

{{/* TLS to the stores: the CA bundles and client certificates of postgres.tls and redis.tls,
mounted read-only under /etc/gateway/tls and named to the processes by their flags'
environment variables. Each takes (dict "root" $ "redis" BOOL): the gateway pods connect to
both stores, the migrations and the operator to Postgres alone. */}}
{{- define "gateway.storeTlsEnv" -}}
{{- $pg := .root.Values.postgres.tls -}}
{{- $redis := .root.Values.redis.tls -}}
{{- if include "gateway.hasPostgres" .root }}
{{- if $pg.caSecret }}
- name: GATEWAY_DATABASE_CA_FILE
  value: /etc/gateway/tls/postgres/ca.crt
{{- end }}
{{- if $pg.clientCertSecret }}
- name: GATEWAY_DATABASE_CLIENT_CERT_FILE
  value: /etc/gateway/tls/postgres-client/tls.crt
- name: GATEWAY_DATABASE_CLIENT_KEY_FILE
  value: /etc/gateway/tls/postgres-client/tls.key
{{- end }}
{{- end }}
{{- if .redis }}
{{- if $redis.caSecret }}
- name: GATEWAY_REDIS_CA_FILE
  value: /etc/gateway/tls/redis/ca.crt
{{- end }}
{{- if $redis.clientCertSecret }}
- name: GATEWAY_REDIS_CLIENT_CERT_FILE
  value: /etc/gateway/tls/redis-client/tls.crt
- name: GATEWAY_REDIS_CLIENT_KEY_FILE
  value: /etc/gateway/tls/redis-client/tls.key
{{- end }}
{{- end }}
{{- end -}}

{{- define "gateway.storeTlsMounts" -}}
{{- range (include "gateway.storeTlsNames" . | fromJsonArray) }}
- name: {{ . }}
  mountPath: /etc/gateway/tls/{{ trimSuffix "-ca" . }}
  readOnly: true
{{- end }}
{{- end -}}

{{- define "gateway.storeTlsVolumes" -}}
{{- $values := .root.Values -}}
{{- range (include "gateway.storeTlsNames" . | fromJsonArray) }}
- name: {{ . }}
  secret:
    {{- if hasSuffix "-client" . }}
    secretName: {{ (get $values (trimSuffix "-client" .)).tls.clientCertSecret }}
    items:
      - key: tls.crt
        path: tls.crt
      - key: tls.key
        path: tls.key
    {{- else }}
    {{- $tls := (get $values (trimSuffix "-ca" .)).tls }}
    secretName: {{ $tls.caSecret }}
    items:
      - key: {{ $tls.caSecretKey }}
        path: ca.crt
    {{- end }}
{{- end }}
{{- end -}}

{{/* The volumes of TLS to the stores a container mounts, as a JSON list of names:
postgres-ca, postgres-client, redis-ca, redis-client. */}}
{{- define "gateway.storeTlsNames" -}}
{{- $names := list -}}
{{- if include "gateway.hasPostgres" .root -}}
{{- if .root.Values.postgres.tls.caSecret }}{{ $names = append $names "postgres-ca" }}{{ end -}}
{{- if .root.Values.postgres.tls.clientCertSecret }}{{ $names = append $names "postgres-client" }}{{ end -}}
{{- end -}}
{{- if .redis -}}
{{- if .root.Values.redis.tls.caSecret }}{{ $names = append $names "redis-ca" }}{{ end -}}
{{- if .root.Values.redis.tls.clientCertSecret }}{{ $names = append $names "redis-client" }}{{ end -}}
{{- end -}}
{{- toJson $names -}}

{{- end -}}
