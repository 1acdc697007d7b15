-- The catalog's schema at the migrations' head, written by `python -m schema.dump --write`
-- from a database migrated to head (tests check that it is current). Read it; do not run it:
-- the migrations are what build a database.
CREATE TABLE alembic_version (
    version_num character varying(32) NOT NULL,
    CONSTRAINT alembic_version_pkc PRIMARY KEY (version_num)
);
-- grants on alembic_version: {OWNER=arwdDxt/OWNER,catalog_reader=r/OWNER}
CREATE TABLE catalog_identity (
    one boolean DEFAULT true NOT NULL,
    id uuid NOT NULL,
    db_oid oid NOT NULL,
    minted_at timestamp with time zone DEFAULT now() NOT NULL,
    CONSTRAINT catalog_identity_one_check CHECK (one),
    CONSTRAINT catalog_identity_pkey PRIMARY KEY (one)
);
-- grants on catalog_identity: {OWNER=arwdDxt/OWNER,catalog_reader=r/OWNER}
CREATE TABLE catalog_setting (
    key character varying(64) NOT NULL,
    value double precision NOT NULL,
    CONSTRAINT catalog_setting_pkey PRIMARY KEY (key)
);
-- grants on catalog_setting: {OWNER=arwdDxt/OWNER,catalog_reader=r/OWNER}
CREATE TABLE checkpoint (
    id integer DEFAULT nextval('checkpoint_id_seq'::regclass) NOT NULL,
    model_id integer NOT NULL,
    step bigint,
    revision text,
    weights_hash character varying(64) NOT NULL,
    duplicate_of_step bigint,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    transformers_nats real,
    CONSTRAINT checkpoint_model_id_fkey FOREIGN KEY (model_id) REFERENCES model(id) ON DELETE CASCADE,
    CONSTRAINT checkpoint_pkey PRIMARY KEY (id),
    CONSTRAINT uq_checkpoint_model_step UNIQUE NULLS NOT DISTINCT (model_id, step)
);
-- grants on checkpoint: {OWNER=arwdDxt/OWNER,catalog_reader=r/OWNER}
CREATE TABLE checkpoint_overlap (
    model text,
    step bigint,
    config_id integer,
    final_pairs bigint,
    present bigint,
    share double precision,
    model_id integer,
    checkpoint_id integer
);
-- grants on checkpoint_overlap: {OWNER=arwdDxt/OWNER,catalog_reader=r/OWNER}
CREATE TABLE checkpoint_summary (
    checkpoint_id integer NOT NULL,
    config_id integer NOT NULL,
    accuracy jsonb NOT NULL,
    faithfulness jsonb NOT NULL,
    heuristic_knockouts jsonb NOT NULL,
    prompt_knockouts jsonb NOT NULL,
    n_heuristic_neurons jsonb NOT NULL,
    written_at timestamp with time zone DEFAULT now() NOT NULL,
    layers integer[],
    n_correct jsonb,
    n_pairs jsonb,
    n_excluded jsonb,
    residual_lens jsonb,
    enrichment jsonb,
    aliases jsonb,
    prompt_explanations jsonb,
    CONSTRAINT checkpoint_summary_checkpoint_id_fkey FOREIGN KEY (checkpoint_id) REFERENCES checkpoint(id) ON DELETE CASCADE,
    CONSTRAINT checkpoint_summary_config_id_fkey FOREIGN KEY (config_id) REFERENCES measure_config(id) ON DELETE CASCADE,
    CONSTRAINT checkpoint_summary_pkey PRIMARY KEY (checkpoint_id, config_id)
);
-- grants on checkpoint_summary: {OWNER=arwdDxt/OWNER,catalog_reader=r/OWNER}
CREATE TABLE circuit_point (
    model_id integer NOT NULL,
    checkpoint_id integer NOT NULL,
    config_id integer NOT NULL,
    op character varying(1) NOT NULL,
    protocol character varying(16) NOT NULL,
    circuit character varying(8) NOT NULL,
    metric character varying(12) NOT NULL,
    k integer NOT NULL,
    fraction real NOT NULL,
    mib boolean NOT NULL,
    paper boolean NOT NULL,
    mean_ratio real,
    mean_ratio_se real,
    ratio_of_means real,
    ratio_of_means_se real,
    median_ratio real,
    n integer NOT NULL,
    n_small integer NOT NULL,
    n_clipped integer,
    max_influence real,
    influence_bound real,
    CONSTRAINT circuit_point_checkpoint_id_fkey FOREIGN KEY (checkpoint_id) REFERENCES checkpoint(id) ON DELETE CASCADE,
    CONSTRAINT circuit_point_config_id_fkey FOREIGN KEY (config_id) REFERENCES measure_config(id) ON DELETE CASCADE,
    CONSTRAINT circuit_point_model_id_fkey FOREIGN KEY (model_id) REFERENCES model(id) ON DELETE CASCADE,
    CONSTRAINT circuit_point_pkey PRIMARY KEY (model_id, checkpoint_id, config_id, op, protocol, circuit, metric, k)
);
-- grants on circuit_point: {OWNER=arwdDxt/OWNER,catalog_reader=r/OWNER}
CREATE TABLE circuit_summary (
    model_id integer NOT NULL,
    checkpoint_id integer NOT NULL,
    config_id integer NOT NULL,
    op character varying(1) NOT NULL,
    protocol character varying(16) NOT NULL,
    late_from smallint,
    late_source character varying(8),
    pruned smallint[] NOT NULL,
    whole smallint[] NOT NULL,
    heads jsonb NOT NULL,
    n_heads_kept integer NOT NULL,
    n_prompts integer NOT NULL,
    n_unique integer NOT NULL,
    seeds smallint NOT NULL,
    context character varying(8) NOT NULL,
    population character varying(8),
    ranking character varying(16) NOT NULL,
    baselines jsonb NOT NULL,
    areas jsonb NOT NULL,
    CONSTRAINT circuit_summary_checkpoint_id_fkey FOREIGN KEY (checkpoint_id) REFERENCES checkpoint(id) ON DELETE CASCADE,
    CONSTRAINT circuit_summary_config_id_fkey FOREIGN KEY (config_id) REFERENCES measure_config(id) ON DELETE CASCADE,
    CONSTRAINT circuit_summary_model_id_fkey FOREIGN KEY (model_id) REFERENCES model(id) ON DELETE CASCADE,
    CONSTRAINT circuit_summary_pkey PRIMARY KEY (model_id, checkpoint_id, config_id, op, protocol)
);
-- grants on circuit_summary: {OWNER=arwdDxt/OWNER,catalog_reader=r/OWNER}
CREATE TABLE component_effect (
    model_id integer NOT NULL,
    checkpoint_id integer NOT NULL,
    config_id integer NOT NULL,
    op character varying(1) NOT NULL,
    layer smallint NOT NULL,
    head smallint NOT NULL,
    position character varying(8) NOT NULL,
    n_pairs integer NOT NULL,
    effect_exact real,
    effect_exact_std real,
    effect_attr real,
    effect_attr_std real,
    effect_log real,
    effect_median real,
    effect_trimmed real,
    moved_share real,
    rank_value real,
    is_exact boolean NOT NULL,
    CONSTRAINT component_effect_checkpoint_id_fkey FOREIGN KEY (checkpoint_id) REFERENCES checkpoint(id) ON DELETE CASCADE,
    CONSTRAINT component_effect_config_id_fkey FOREIGN KEY (config_id) REFERENCES measure_config(id) ON DELETE CASCADE,
    CONSTRAINT component_effect_model_id_fkey FOREIGN KEY (model_id) REFERENCES model(id) ON DELETE CASCADE,
    CONSTRAINT component_effect_pkey PRIMARY KEY (model_id, checkpoint_id, config_id, op, layer, head, "position")
);
-- grants on component_effect: {OWNER=arwdDxt/OWNER,catalog_reader=r/OWNER}
CREATE TABLE derived_layer (
    model_id integer NOT NULL,
    checkpoint_id integer NOT NULL,
    config_id integer NOT NULL,
    layer smallint NOT NULL,
    written_at timestamp with time zone NOT NULL,
    CONSTRAINT derived_layer_checkpoint_id_fkey FOREIGN KEY (checkpoint_id) REFERENCES checkpoint(id) ON DELETE CASCADE,
    CONSTRAINT derived_layer_config_id_fkey FOREIGN KEY (config_id) REFERENCES measure_config(id) ON DELETE CASCADE,
    CONSTRAINT derived_layer_model_id_fkey FOREIGN KEY (model_id) REFERENCES model(id) ON DELETE CASCADE,
    CONSTRAINT derived_layer_pkey PRIMARY KEY (checkpoint_id, config_id, layer)
);
-- grants on derived_layer: {OWNER=arwdDxt/OWNER,catalog_reader=r/OWNER}
CREATE TABLE emergence_histogram (
    model text NOT NULL,
    model_id integer NOT NULL,
    config_id integer NOT NULL,
    op character varying(1) NOT NULL,
    family character varying(32) NOT NULL,
    emergence_step bigint,
    pairs bigint NOT NULL
);
-- grants on emergence_histogram: {OWNER=arwdDxt/OWNER,catalog_reader=r/OWNER}
CREATE TABLE emergence_run (
    model_id integer NOT NULL,
    config_id integer NOT NULL,
    layer smallint NOT NULL,
    neuron integer NOT NULL,
    op character varying(1) NOT NULL,
    heuristic_id integer NOT NULL,
    emergence_step bigint,
    CONSTRAINT emergence_run_pkey PRIMARY KEY (model_id, config_id, layer, neuron, op, heuristic_id)
);
-- grants on emergence_run: {OWNER=arwdDxt/OWNER,catalog_reader=r/OWNER}
CREATE TABLE explain_request (
    id integer DEFAULT nextval('explain_request_id_seq'::regclass) NOT NULL,
    model_id integer NOT NULL,
    checkpoint_id integer NOT NULL,
    config_id integer NOT NULL,
    prompt text NOT NULL,
    seeds integer NOT NULL,
    status character varying(8) DEFAULT 'queued'::character varying NOT NULL,
    error text,
    worker text,
    starts integer DEFAULT 0 NOT NULL,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    started_at timestamp with time zone,
    finished_at timestamp with time zone,
    CONSTRAINT explain_request_checkpoint_id_fkey FOREIGN KEY (checkpoint_id) REFERENCES checkpoint(id) ON DELETE CASCADE,
    CONSTRAINT explain_request_config_id_fkey FOREIGN KEY (config_id) REFERENCES measure_config(id) ON DELETE CASCADE,
    CONSTRAINT explain_request_model_id_fkey FOREIGN KEY (model_id) REFERENCES model(id) ON DELETE CASCADE,
    CONSTRAINT explain_request_pkey PRIMARY KEY (id),
    CONSTRAINT explain_request_seeds_check CHECK ((seeds >= 0)),
    CONSTRAINT explain_request_status_check CHECK (((status)::text = ANY ((ARRAY['queued'::character varying, 'running'::character varying, 'done'::character varying, 'failed'::character varying])::text[])))
);
-- grants on explain_request: {OWNER=arwdDxt/OWNER,catalog_reader=r/OWNER}
CREATE TABLE final_circuit_point (
    model_id integer NOT NULL,
    checkpoint_id integer NOT NULL,
    config_id integer NOT NULL,
    op character varying(1) NOT NULL,
    final_checkpoint_id integer NOT NULL,
    circuit character varying(8) NOT NULL,
    metric character varying(12) NOT NULL,
    k integer NOT NULL,
    fraction real NOT NULL,
    mib boolean NOT NULL,
    paper boolean NOT NULL,
    mean_ratio real,
    mean_ratio_se real,
    ratio_of_means real,
    ratio_of_means_se real,
    median_ratio real,
    n integer NOT NULL,
    n_small integer NOT NULL,
    n_clipped integer,
    max_influence real,
    influence_bound real,
    CONSTRAINT final_circuit_point_checkpoint_id_fkey FOREIGN KEY (checkpoint_id) REFERENCES checkpoint(id) ON DELETE CASCADE,
    CONSTRAINT final_circuit_point_circuit_check CHECK (((circuit)::text = ANY ((ARRAY['ranked'::character varying, 'random'::character varying])::text[]))),
    CONSTRAINT final_circuit_point_config_id_fkey FOREIGN KEY (config_id) REFERENCES measure_config(id) ON DELETE CASCADE,
    CONSTRAINT final_circuit_point_final_checkpoint_id_fkey FOREIGN KEY (final_checkpoint_id) REFERENCES checkpoint(id) ON DELETE CASCADE,
    CONSTRAINT final_circuit_point_model_id_fkey FOREIGN KEY (model_id) REFERENCES model(id) ON DELETE CASCADE,
    CONSTRAINT final_circuit_point_pkey PRIMARY KEY (model_id, checkpoint_id, config_id, op, circuit, metric, k)
);
-- grants on final_circuit_point: {OWNER=arwdDxt/OWNER,catalog_reader=r/OWNER}
CREATE TABLE grid_layout (
    config_id integer NOT NULL,
    number_limit integer NOT NULL,
    op character varying(1) NOT NULL,
    lo integer NOT NULL,
    side integer NOT NULL,
    n_cells integer NOT NULL,
    valid bytea NOT NULL,
    answer_index bytea NOT NULL,
    CONSTRAINT grid_layout_config_id_fkey FOREIGN KEY (config_id) REFERENCES measure_config(id) ON DELETE CASCADE,
    CONSTRAINT grid_layout_pkey PRIMARY KEY (config_id, number_limit, op)
);
-- grants on grid_layout: {OWNER=arwdDxt/OWNER,catalog_reader=r/OWNER}
CREATE TABLE heuristic (
    id integer DEFAULT nextval('heuristic_id_seq'::regclass) NOT NULL,
    key text NOT NULL,
    family character varying(32) NOT NULL,
    target character varying(8) NOT NULL,
    params jsonb NOT NULL,
    label text NOT NULL,
    CONSTRAINT heuristic_key_key UNIQUE (key),
    CONSTRAINT heuristic_pkey PRIMARY KEY (id)
);
-- grants on heuristic: {OWNER=arwdDxt/OWNER,catalog_reader=r/OWNER}
CREATE TABLE heuristic_census (
    model text,
    step bigint,
    config_id integer,
    op character varying(1),
    family character varying(32),
    circuit_neurons bigint,
    model_id integer,
    checkpoint_id integer
);
-- grants on heuristic_census: {OWNER=arwdDxt/OWNER,catalog_reader=r/OWNER}
CREATE TABLE job (
    id integer DEFAULT nextval('job_id_seq'::regclass) NOT NULL,
    job_key character varying(64) NOT NULL,
    model_name text NOT NULL,
    step bigint,
    config_id integer NOT NULL,
    layers integer[] NOT NULL,
    device character varying(32) NOT NULL,
    force boolean NOT NULL,
    status character varying(16) NOT NULL,
    checkpoint_id integer,
    error text,
    failed_layer integer,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    updated_at timestamp with time zone DEFAULT now() NOT NULL,
    finished_at timestamp with time zone,
    grid_neurons integer[],
    CONSTRAINT job_checkpoint_id_fkey FOREIGN KEY (checkpoint_id) REFERENCES checkpoint(id) ON DELETE SET NULL,
    CONSTRAINT job_config_id_fkey FOREIGN KEY (config_id) REFERENCES measure_config(id) ON DELETE CASCADE,
    CONSTRAINT job_job_key_key UNIQUE (job_key),
    CONSTRAINT job_pkey PRIMARY KEY (id)
);
-- grants on job: {OWNER=arwdDxt/OWNER,catalog_reader=r/OWNER}
CREATE TABLE job_layer (
    job_id integer NOT NULL,
    layer smallint NOT NULL,
    status character varying(16) NOT NULL,
    worker text,
    attempts integer NOT NULL,
    started_at timestamp with time zone,
    finished_at timestamp with time zone,
    error text,
    heartbeat_at timestamp with time zone,
    sent_at timestamp with time zone,
    resends integer DEFAULT 0 NOT NULL,
    sends integer DEFAULT 0 NOT NULL,
    loss_kinds text[] DEFAULT '{}'::text[] NOT NULL,
    CONSTRAINT job_layer_job_id_fkey FOREIGN KEY (job_id) REFERENCES job(id) ON DELETE CASCADE,
    CONSTRAINT job_layer_pkey PRIMARY KEY (job_id, layer)
);
-- grants on job_layer: {OWNER=arwdDxt/OWNER,catalog_reader=r/OWNER}
CREATE TABLE label_histogram (
    model text,
    step bigint,
    config_id integer,
    op character varying(1),
    family character varying(32),
    score_from numeric,
    p_decade smallint,
    labels bigint,
    base_rate_sum double precision,
    base_rates bigint,
    model_id integer,
    checkpoint_id integer
);
-- grants on label_histogram: {OWNER=arwdDxt/OWNER,catalog_reader=r/OWNER}
CREATE TABLE layer_result (
    checkpoint_id integer NOT NULL,
    config_id integer NOT NULL,
    layer smallint NOT NULL,
    n_neurons integer NOT NULL,
    n_scores integer NOT NULL,
    worker text,
    seconds double precision,
    written_at timestamp with time zone DEFAULT now() NOT NULL,
    patching jsonb,
    label_control jsonb,
    CONSTRAINT layer_result_checkpoint_id_fkey FOREIGN KEY (checkpoint_id) REFERENCES checkpoint(id) ON DELETE CASCADE,
    CONSTRAINT layer_result_config_id_fkey FOREIGN KEY (config_id) REFERENCES measure_config(id) ON DELETE CASCADE,
    CONSTRAINT layer_result_pkey PRIMARY KEY (checkpoint_id, config_id, layer)
);
-- grants on layer_result: {OWNER=arwdDxt/OWNER,catalog_reader=r/OWNER}
CREATE TABLE measure_config (
    id integer DEFAULT nextval('measure_config_id_seq'::regclass) NOT NULL,
    config_hash character varying(64) NOT NULL,
    config jsonb NOT NULL,
    operators character varying(8) NOT NULL,
    operand_lo integer NOT NULL,
    operand_hi integer NOT NULL,
    template text NOT NULL,
    pairs_per_op integer NOT NULL,
    seed integer NOT NULL,
    heuristic_variant character varying(16) NOT NULL,
    catalog_version character varying(32) NOT NULL,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    CONSTRAINT measure_config_config_hash_key UNIQUE (config_hash),
    CONSTRAINT measure_config_pkey PRIMARY KEY (id)
);
-- grants on measure_config: {OWNER=arwdDxt/OWNER,catalog_reader=r/OWNER}
CREATE TABLE model (
    id integer DEFAULT nextval('model_id_seq'::regclass) NOT NULL,
    name text NOT NULL,
    source character varying(16) NOT NULL,
    n_layers integer NOT NULL,
    d_model integer NOT NULL,
    d_mlp integer NOT NULL,
    d_vocab integer NOT NULL,
    act_fn text NOT NULL,
    gated_mlp boolean NOT NULL,
    number_limit integer NOT NULL,
    digit_level boolean NOT NULL,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    CONSTRAINT model_name_key UNIQUE (name),
    CONSTRAINT model_pkey PRIMARY KEY (id)
);
-- grants on model: {OWNER=arwdDxt/OWNER,catalog_reader=r/OWNER}
CREATE TABLE neuron_counterpart (
    from_checkpoint_id integer NOT NULL,
    to_checkpoint_id integer NOT NULL,
    config_id integer NOT NULL,
    layer smallint NOT NULL,
    neuron integer NOT NULL,
    best_layer smallint NOT NULL,
    best_neuron integer NOT NULL,
    best_similarity real NOT NULL,
    one_to_one_layer smallint,
    one_to_one_neuron integer,
    one_to_one_similarity real,
    null_threshold real NOT NULL,
    level real NOT NULL,
    has_counterpart boolean NOT NULL,
    null_models text NOT NULL,
    n_cells integer NOT NULL,
    written_at timestamp with time zone DEFAULT now() NOT NULL,
    CONSTRAINT neuron_counterpart_config_id_fkey FOREIGN KEY (config_id) REFERENCES measure_config(id) ON DELETE CASCADE,
    CONSTRAINT neuron_counterpart_from_checkpoint_id_fkey FOREIGN KEY (from_checkpoint_id) REFERENCES checkpoint(id) ON DELETE CASCADE,
    CONSTRAINT neuron_counterpart_pkey PRIMARY KEY (from_checkpoint_id, to_checkpoint_id, config_id, layer, neuron),
    CONSTRAINT neuron_counterpart_to_checkpoint_id_fkey FOREIGN KEY (to_checkpoint_id) REFERENCES checkpoint(id) ON DELETE CASCADE
);
-- grants on neuron_counterpart: {OWNER=arwdDxt/OWNER,catalog_reader=r/OWNER}
CREATE TABLE neuron_grid (
    model_id integer NOT NULL,
    checkpoint_id integer NOT NULL,
    config_id integer NOT NULL,
    layer smallint NOT NULL,
    neuron integer NOT NULL,
    op character varying(1) NOT NULL,
    q bytea NOT NULL,
    scale real NOT NULL,
    vmin real NOT NULL,
    codec smallint DEFAULT '0'::smallint NOT NULL,
    sketch boolean DEFAULT false NOT NULL,
    CONSTRAINT neuron_grid_pkey PRIMARY KEY (model_id, checkpoint_id, config_id, layer, neuron, op)
) PARTITION BY HASH (model_id);
-- grants on neuron_grid: {OWNER=arwdDxt/OWNER,catalog_reader=r/OWNER}
CREATE TABLE neuron_lens (
    model_id integer NOT NULL,
    checkpoint_id integer NOT NULL,
    config_id integer NOT NULL,
    layer smallint NOT NULL,
    neuron integer NOT NULL,
    numbers real[] NOT NULL,
    top_tokens text[] NOT NULL,
    top_values real[] NOT NULL,
    bottom_tokens text[] NOT NULL,
    bottom_values real[] NOT NULL,
    CONSTRAINT neuron_lens_pkey PRIMARY KEY (model_id, checkpoint_id, config_id, layer, neuron)
) PARTITION BY HASH (model_id);
-- grants on neuron_lens: {OWNER=arwdDxt/OWNER,catalog_reader=r/OWNER}
CREATE TABLE neuron_op (
    model_id integer NOT NULL,
    checkpoint_id integer NOT NULL,
    config_id integer NOT NULL,
    layer smallint NOT NULL,
    neuron integer NOT NULL,
    op character varying(1) NOT NULL,
    max_act real NOT NULL,
    mean_act real NOT NULL,
    density real NOT NULL,
    effect_exact real,
    effect_exact_std real,
    effect_attr real,
    effect_attr_std real,
    rank integer NOT NULL,
    op_accuracy real NOT NULL,
    best_heuristic_id integer,
    best_score real,
    effect_log real,
    effect_median real,
    effect_trimmed real,
    moved_share real,
    rank_value real,
    is_exact boolean,
    constant boolean,
    best_bottom boolean,
    labelled boolean,
    spec_helix smallint,
    op1_spec smallint,
    op2_spec smallint,
    result_spec smallint,
    kv_spec smallint,
    op1_fitlin smallint,
    op2_fitlin smallint,
    result_fitlin smallint,
    fit_operands real,
    fit_result real,
    fit_joint real,
    fit_other real,
    kv_fit_operands real,
    kv_fit_result real,
    kv_fit_joint real,
    kv_fit_other real,
    fit_other_op text,
    kv_fit_other_op text,
    mean_kv real,
    CONSTRAINT neuron_op_pkey PRIMARY KEY (model_id, checkpoint_id, config_id, layer, neuron, op)
) PARTITION BY HASH (model_id);
-- grants on neuron_op: {OWNER=arwdDxt/OWNER,catalog_reader=r/OWNER}
CREATE TABLE neuron_score (
    model_id integer NOT NULL,
    checkpoint_id integer NOT NULL,
    config_id integer NOT NULL,
    layer smallint NOT NULL,
    neuron integer NOT NULL,
    op character varying(1) NOT NULL,
    heuristic_id integer NOT NULL,
    score real NOT NULL,
    bottom boolean NOT NULL,
    base_rate real,
    p_value double precision,
    implements boolean,
    testable boolean,
    CONSTRAINT neuron_score_pkey PRIMARY KEY (model_id, checkpoint_id, config_id, layer, neuron, op, heuristic_id)
) PARTITION BY HASH (model_id);
-- grants on neuron_score: {OWNER=arwdDxt/OWNER,catalog_reader=r/OWNER}
CREATE TABLE prompt_explanation (
    model_id integer NOT NULL,
    checkpoint_id integer NOT NULL,
    config_id integer NOT NULL,
    prompt text NOT NULL,
    op character varying(1) NOT NULL,
    a integer NOT NULL,
    b integer NOT NULL,
    result integer NOT NULL,
    predicted text NOT NULL,
    correct boolean NOT NULL,
    p_answer double precision NOT NULL,
    rank_answer integer NOT NULL,
    target double precision NOT NULL,
    share_holds double precision,
    share_labelled_other double precision,
    share_other_neurons double precision,
    share_heads double precision,
    share_rest double precision,
    neurons_50 integer,
    neurons_80 integer,
    heuristics_in_80 integer,
    labelled boolean NOT NULL,
    n_knocked integer,
    p_knocked double precision,
    p_random double precision,
    p_random_se double precision,
    explanation jsonb NOT NULL,
    written_at timestamp with time zone DEFAULT now() NOT NULL,
    CONSTRAINT prompt_explanation_checkpoint_id_fkey FOREIGN KEY (checkpoint_id) REFERENCES checkpoint(id) ON DELETE CASCADE,
    CONSTRAINT prompt_explanation_config_id_fkey FOREIGN KEY (config_id) REFERENCES measure_config(id) ON DELETE CASCADE,
    CONSTRAINT prompt_explanation_model_id_fkey FOREIGN KEY (model_id) REFERENCES model(id) ON DELETE CASCADE,
    CONSTRAINT prompt_explanation_pkey PRIMARY KEY (checkpoint_id, config_id, prompt)
);
-- grants on prompt_explanation: {OWNER=arwdDxt/OWNER,catalog_reader=r/OWNER}
CREATE TABLE reconcile_event (
    id bigint DEFAULT nextval('reconcile_event_id_seq'::regclass) NOT NULL,
    at timestamp with time zone DEFAULT now() NOT NULL,
    job_id integer NOT NULL,
    layer smallint,
    action character varying(32) NOT NULL,
    detail jsonb,
    CONSTRAINT reconcile_event_job_id_fkey FOREIGN KEY (job_id) REFERENCES job(id) ON DELETE CASCADE,
    CONSTRAINT reconcile_event_pkey PRIMARY KEY (id)
);
-- grants on reconcile_event: {OWNER=arwdDxt/OWNER,catalog_reader=r/OWNER}

-- indexes
CREATE UNIQUE INDEX alembic_version_pkc ON public.alembic_version USING btree (version_num);
CREATE UNIQUE INDEX catalog_identity_pkey ON public.catalog_identity USING btree (one);
CREATE UNIQUE INDEX catalog_setting_pkey ON public.catalog_setting USING btree (key);
CREATE UNIQUE INDEX checkpoint_pkey ON public.checkpoint USING btree (id);
CREATE INDEX ix_checkpoint_model_id ON public.checkpoint USING btree (model_id);
CREATE INDEX ix_checkpoint_weights_hash ON public.checkpoint USING btree (weights_hash);
CREATE UNIQUE INDEX uq_checkpoint_model_step ON public.checkpoint USING btree (model_id, step) NULLS NOT DISTINCT;
CREATE INDEX ix_checkpoint_overlap_checkpoint ON public.checkpoint_overlap USING btree (model_id, config_id, checkpoint_id);
CREATE INDEX ix_checkpoint_overlap_model_id ON public.checkpoint_overlap USING btree (model_id);
CREATE UNIQUE INDEX checkpoint_summary_pkey ON public.checkpoint_summary USING btree (checkpoint_id, config_id);
CREATE UNIQUE INDEX circuit_point_pkey ON public.circuit_point USING btree (model_id, checkpoint_id, config_id, op, protocol, circuit, metric, k);
CREATE UNIQUE INDEX circuit_summary_pkey ON public.circuit_summary USING btree (model_id, checkpoint_id, config_id, op, protocol);
CREATE UNIQUE INDEX component_effect_pkey ON public.component_effect USING btree (model_id, checkpoint_id, config_id, op, layer, head, "position");
CREATE UNIQUE INDEX derived_layer_pkey ON public.derived_layer USING btree (checkpoint_id, config_id, layer);
CREATE INDEX ix_derived_layer_model ON public.derived_layer USING btree (model_id, config_id, layer);
CREATE INDEX ix_emergence_histogram_model ON public.emergence_histogram USING btree (model, op);
CREATE UNIQUE INDEX ux_emergence_histogram ON public.emergence_histogram USING btree (model_id, config_id, op, family, emergence_step) NULLS NOT DISTINCT;
CREATE UNIQUE INDEX emergence_run_pkey ON public.emergence_run USING btree (model_id, config_id, layer, neuron, op, heuristic_id);
CREATE INDEX ix_emergence_run_op ON public.emergence_run USING btree (model_id, op, emergence_step);
CREATE UNIQUE INDEX explain_request_open_idx ON public.explain_request USING btree (checkpoint_id, config_id, prompt) WHERE ((status)::text = ANY ((ARRAY['queued'::character varying, 'running'::character varying])::text[]));
CREATE UNIQUE INDEX explain_request_pkey ON public.explain_request USING btree (id);
CREATE INDEX explain_request_prompt_idx ON public.explain_request USING btree (checkpoint_id, config_id, prompt, id);
CREATE UNIQUE INDEX final_circuit_point_pkey ON public.final_circuit_point USING btree (model_id, checkpoint_id, config_id, op, circuit, metric, k);
CREATE INDEX ix_final_circuit_point_final_checkpoint_id ON public.final_circuit_point USING btree (final_checkpoint_id);
CREATE UNIQUE INDEX grid_layout_pkey ON public.grid_layout USING btree (config_id, number_limit, op);
CREATE UNIQUE INDEX heuristic_key_key ON public.heuristic USING btree (key);
CREATE UNIQUE INDEX heuristic_pkey ON public.heuristic USING btree (id);
CREATE INDEX ix_heuristic_family ON public.heuristic USING btree (family);
CREATE INDEX ix_heuristic_census_checkpoint ON public.heuristic_census USING btree (model_id, checkpoint_id, config_id);
CREATE INDEX ix_heuristic_census_model ON public.heuristic_census USING btree (model, step, op);
CREATE INDEX ix_heuristic_census_model_id ON public.heuristic_census USING btree (model_id);
CREATE INDEX ix_job_status ON public.job USING btree (status);
CREATE UNIQUE INDEX job_job_key_key ON public.job USING btree (job_key);
CREATE UNIQUE INDEX job_pkey ON public.job USING btree (id);
CREATE UNIQUE INDEX job_layer_pkey ON public.job_layer USING btree (job_id, layer);
CREATE INDEX ix_label_histogram_checkpoint ON public.label_histogram USING btree (model_id, checkpoint_id);
CREATE INDEX ix_label_histogram_model ON public.label_histogram USING btree (model, step);
CREATE UNIQUE INDEX layer_result_pkey ON public.layer_result USING btree (checkpoint_id, config_id, layer);
CREATE UNIQUE INDEX measure_config_config_hash_key ON public.measure_config USING btree (config_hash);
CREATE UNIQUE INDEX measure_config_pkey ON public.measure_config USING btree (id);
CREATE UNIQUE INDEX model_name_key ON public.model USING btree (name);
CREATE UNIQUE INDEX model_pkey ON public.model USING btree (id);
CREATE UNIQUE INDEX neuron_counterpart_pkey ON public.neuron_counterpart USING btree (from_checkpoint_id, to_checkpoint_id, config_id, layer, neuron);
CREATE INDEX neuron_counterpart_to_idx ON public.neuron_counterpart USING btree (to_checkpoint_id, config_id, best_layer, best_neuron);
CREATE UNIQUE INDEX neuron_grid_pkey ON ONLY public.neuron_grid USING btree (model_id, checkpoint_id, config_id, layer, neuron, op);
CREATE UNIQUE INDEX neuron_lens_pkey ON ONLY public.neuron_lens USING btree (model_id, checkpoint_id, config_id, layer, neuron);
CREATE INDEX ix_neuron_op_effect_size ON ONLY public.neuron_op USING btree (model_id, checkpoint_id, config_id, abs(rank_value) DESC NULLS LAST);
CREATE INDEX ix_neuron_op_kv_period ON ONLY public.neuron_op USING btree (model_id, checkpoint_id, ((kv_spec / 300))) WHERE (((spec_helix)::integer & 8) <> 0);
CREATE INDEX ix_neuron_op_neuron ON ONLY public.neuron_op USING btree (model_id, layer, neuron, op);
CREATE INDEX ix_neuron_op_op1_period ON ONLY public.neuron_op USING btree (model_id, checkpoint_id, ((op1_spec / 300))) WHERE (((spec_helix)::integer & 1) <> 0);
CREATE INDEX ix_neuron_op_op2_period ON ONLY public.neuron_op USING btree (model_id, checkpoint_id, ((op2_spec / 300))) WHERE (((spec_helix)::integer & 2) <> 0);
CREATE INDEX ix_neuron_op_rank ON ONLY public.neuron_op USING btree (model_id, checkpoint_id, op, rank);
CREATE INDEX ix_neuron_op_rank_order ON ONLY public.neuron_op USING btree (model_id, checkpoint_id, config_id, rank);
CREATE INDEX ix_neuron_op_result_period ON ONLY public.neuron_op USING btree (model_id, checkpoint_id, ((result_spec / 300))) WHERE (((spec_helix)::integer & 4) <> 0);
CREATE INDEX ix_neuron_op_score_order ON ONLY public.neuron_op USING btree (model_id, checkpoint_id, config_id, best_score DESC NULLS LAST, layer, neuron, op);
CREATE UNIQUE INDEX neuron_op_pkey ON ONLY public.neuron_op USING btree (model_id, checkpoint_id, config_id, layer, neuron, op);
CREATE INDEX ix_neuron_score_checkpoint_heuristic ON ONLY public.neuron_score USING btree (model_id, checkpoint_id, heuristic_id, score);
CREATE INDEX ix_neuron_score_label ON ONLY public.neuron_score USING btree (model_id, checkpoint_id, heuristic_id, op, score) WHERE implements;
CREATE UNIQUE INDEX neuron_score_pkey ON ONLY public.neuron_score USING btree (model_id, checkpoint_id, config_id, layer, neuron, op, heuristic_id);
CREATE INDEX prompt_explanation_model_idx ON public.prompt_explanation USING btree (model_id, prompt);
CREATE UNIQUE INDEX prompt_explanation_pkey ON public.prompt_explanation USING btree (checkpoint_id, config_id, prompt);
CREATE INDEX ix_reconcile_event_job ON public.reconcile_event USING btree (job_id, at);
CREATE UNIQUE INDEX reconcile_event_pkey ON public.reconcile_event USING btree (id);

CREATE VIEW circuit_curve AS
 SELECT m.name AS model,
    c.step,
    p.config_id,
    p.op,
    p.protocol,
    p.circuit,
    p.metric,
    p.k,
    p.fraction,
    p.mib,
    p.paper,
    p.mean_ratio,
    p.mean_ratio_se,
    p.ratio_of_means,
    p.ratio_of_means_se,
    p.median_ratio,
    p.n,
    p.n_small,
    s.late_from,
    s.late_source,
    s.pruned,
    s.whole,
    s.n_heads_kept,
    s.ranking,
    p.model_id,
    p.checkpoint_id
   FROM circuit_point p
     JOIN circuit_summary s USING (model_id, checkpoint_id, config_id, op, protocol)
     JOIN checkpoint c ON c.id = p.checkpoint_id
     JOIN model m ON m.id = p.model_id;
-- grants on circuit_curve: {OWNER=arwdDxt/OWNER,catalog_reader=r/OWNER}

CREATE VIEW circuit_neurons AS
 SELECT m.name AS model,
    c.step,
    n.layer,
    n.neuron,
    n.op,
    n.config_id,
    n.rank,
    n.effect_exact,
    n.effect_attr,
    h.label AS best_heuristic,
    n.best_score,
    n.model_id,
    n.checkpoint_id,
    n.rank_value,
    n.is_exact,
    n.best_bottom,
    n.labelled
   FROM neuron_op n
     JOIN checkpoint c ON c.id = n.checkpoint_id
     JOIN model m ON m.id = n.model_id
     LEFT JOIN heuristic h ON h.id = n.best_heuristic_id
  WHERE n.rank < (( SELECT ceil(catalog_setting.value)::integer AS ceil
           FROM catalog_setting
          WHERE catalog_setting.key::text = 'circuit_k'::text));
-- grants on circuit_neurons: {OWNER=arwdDxt/OWNER,catalog_reader=r/OWNER}

CREATE VIEW circuit_persistence AS
 WITH circuit AS (
         SELECT s_1.model_id,
            s_1.checkpoint_id,
            s_1.config_id,
            s_1.op,
            ARRAY( SELECT t.layer::bigint * '4294967296'::bigint + t.neuron
                   FROM unnest(s_1.pruned) pl(layer)
                     CROSS JOIN LATERAL ( SELECT n.layer,
                            n.neuron
                           FROM neuron_op n
                          WHERE n.model_id = s_1.model_id AND n.checkpoint_id = s_1.checkpoint_id AND n.config_id = s_1.config_id AND n.op::text = s_1.op::text AND n.layer = pl.layer
                          ORDER BY (
                                CASE
                                    WHEN s_1.ranking::text = 'attribution'::text THEN - (n.effect_attr + n.effect_attr_std)
                                    ELSE n.rank::real
                                END), n.neuron
                         LIMIT ( SELECT floor(catalog_setting.value)::bigint AS floor
                                   FROM catalog_setting
                                  WHERE catalog_setting.key::text = 'circuit_k'::text)) t) AS members
           FROM circuit_summary s_1
          WHERE s_1.protocol::text = 'paper'::text
        ), final AS (
         SELECT DISTINCT ON (s_1.model_id, s_1.config_id, s_1.op) s_1.model_id,
            s_1.config_id,
            s_1.op,
            s_1.checkpoint_id
           FROM circuit_summary s_1
             JOIN checkpoint c_1 ON c_1.id = s_1.checkpoint_id
          WHERE s_1.protocol::text = 'paper'::text
          ORDER BY s_1.model_id, s_1.config_id, s_1.op, c_1.step DESC NULLS LAST
        )
 SELECT m.name AS model,
    c.step,
    s.config_id,
    s.op,
    cardinality(f.members)::bigint AS n_final,
    shared.n AS n_shared,
    shared.n::real / NULLIF(cardinality(f.members)::bigint, 0)::double precision AS share,
    s.model_id,
    s.checkpoint_id
   FROM circuit_summary s
     JOIN final fin ON fin.model_id = s.model_id AND fin.config_id = s.config_id AND fin.op::text = s.op::text
     JOIN circuit f ON f.model_id = fin.model_id AND f.checkpoint_id = fin.checkpoint_id AND f.config_id = fin.config_id AND f.op::text = fin.op::text AND cardinality(f.members) > 0
     JOIN circuit e ON e.model_id = s.model_id AND e.checkpoint_id = s.checkpoint_id AND e.config_id = s.config_id AND e.op::text = s.op::text
     CROSS JOIN LATERAL ( SELECT count(*) AS n
           FROM unnest(f.members) x(x)
          WHERE x.x = ANY (e.members)) shared
     JOIN checkpoint c ON c.id = s.checkpoint_id
     JOIN model m ON m.id = s.model_id
  WHERE s.protocol::text = 'paper'::text;
-- grants on circuit_persistence: {OWNER=arwdDxt/OWNER,catalog_reader=r/OWNER}

CREATE VIEW component_effects AS
 SELECT m.name AS model,
    c.step,
    e.config_id,
    e.op,
    e.layer,
        CASE
            WHEN e.head < 0 THEN 'MLP'::text
            ELSE 'H'::text || e.head
        END AS component,
    e.head,
    e."position",
    e.n_pairs,
    e.effect_exact,
    e.effect_exact_std,
    e.effect_attr,
    e.effect_attr_std,
    e.effect_log,
    e.effect_median,
    e.effect_trimmed,
    e.moved_share,
    e.rank_value,
    e.is_exact,
    e.model_id,
    e.checkpoint_id
   FROM component_effect e
     JOIN checkpoint c ON c.id = e.checkpoint_id
     JOIN model m ON m.id = e.model_id;
-- grants on component_effects: {OWNER=arwdDxt/OWNER,catalog_reader=r/OWNER}

CREATE VIEW final_circuit_faithfulness AS
 WITH last AS (
         SELECT DISTINCT ON (s.model_id, s.config_id, s.op) s.model_id,
            s.config_id,
            s.op,
            s.checkpoint_id
           FROM circuit_summary s
             JOIN checkpoint c_1 ON c_1.id = s.checkpoint_id
          WHERE s.protocol::text = 'paper'::text
          ORDER BY s.model_id, s.config_id, s.op, c_1.step DESC NULLS LAST
        ), rows AS (
         SELECT f.model_id,
            f.checkpoint_id,
            f.config_id,
            f.op,
            f.metric,
            f.k,
            f.fraction,
            f.final_checkpoint_id,
            f.ratio_of_means AS final,
            f.ratio_of_means_se AS final_se,
            r.ratio_of_means AS random,
            r.ratio_of_means_se AS random_se,
            f.n,
            f.n_small
           FROM final_circuit_point f
             LEFT JOIN final_circuit_point r ON r.model_id = f.model_id AND r.checkpoint_id = f.checkpoint_id AND r.config_id = f.config_id AND r.op::text = f.op::text AND r.metric::text = f.metric::text AND r.k = f.k AND r.circuit::text = 'random'::text
          WHERE f.circuit::text = 'ranked'::text
        UNION ALL
         SELECT p.model_id,
            p.checkpoint_id,
            p.config_id,
            p.op,
            p.metric,
            p.k,
            p.fraction,
            p.checkpoint_id,
            p.ratio_of_means,
            p.ratio_of_means_se,
            r.ratio_of_means,
            r.ratio_of_means_se,
            p.n,
            p.n_small
           FROM circuit_point p
             JOIN last l ON l.model_id = p.model_id AND l.checkpoint_id = p.checkpoint_id AND l.config_id = p.config_id AND l.op::text = p.op::text
             LEFT JOIN circuit_point r ON r.model_id = p.model_id AND r.checkpoint_id = p.checkpoint_id AND r.config_id = p.config_id AND r.op::text = p.op::text AND r.protocol::text = 'paper'::text AND r.circuit::text = 'random'::text AND r.metric::text = p.metric::text AND r.k = p.k
          WHERE p.protocol::text = 'paper'::text AND p.circuit::text = 'ranked'::text
        )
 SELECT m.name AS model,
    c.step,
    x.config_id,
    x.op,
    x.metric,
    x.k,
    x.fraction,
    o.ratio_of_means AS own,
    o.ratio_of_means_se AS own_se,
    x.final,
    x.final_se,
    x.random,
    x.random_se,
    x.n,
    x.n_small,
    fc.step AS final_step,
    x.model_id,
    x.checkpoint_id
   FROM rows x
     JOIN model m ON m.id = x.model_id
     JOIN checkpoint c ON c.id = x.checkpoint_id
     JOIN checkpoint fc ON fc.id = x.final_checkpoint_id
     LEFT JOIN circuit_point o ON o.model_id = x.model_id AND o.checkpoint_id = x.checkpoint_id AND o.config_id = x.config_id AND o.op::text = x.op::text AND o.protocol::text = 'paper'::text AND o.circuit::text = 'ranked'::text AND o.metric::text = x.metric::text AND o.k = x.k;
-- grants on final_circuit_faithfulness: {OWNER=arwdDxt/OWNER,catalog_reader=r/OWNER}

CREATE VIEW heuristic_emergence AS
 SELECT m.name AS model,
    r.layer,
    r.neuron,
    r.op,
    r.config_id,
    h.label AS heuristic,
    h.family,
    r.emergence_step,
        CASE
            WHEN r.emergence_step IS NULL THEN 1::bigint
            ELSE (cardinality(ls.steps) - width_bucket(r.emergence_step, ls.steps) + 1)::bigint
        END AS checkpoints_held,
    r.model_id,
    r.heuristic_id
   FROM emergence_run r
     JOIN model m ON m.id = r.model_id
     LEFT JOIN heuristic h ON h.id = r.heuristic_id
     LEFT JOIN ( SELECT d.model_id,
            d.config_id,
            d.layer,
            array_agg(c.step ORDER BY c.step) FILTER (WHERE c.step IS NOT NULL) AS steps
           FROM derived_layer d
             JOIN checkpoint c ON c.id = d.checkpoint_id
          GROUP BY d.model_id, d.config_id, d.layer) ls ON ls.model_id = r.model_id AND ls.config_id = r.config_id AND ls.layer = r.layer;
-- grants on heuristic_emergence: {OWNER=arwdDxt/OWNER,catalog_reader=r/OWNER}

CREATE VIEW heuristic_share AS
 WITH stored AS (
         SELECT m.name AS model,
            regexp_replace(m.name, '[-@]seed[0-9]+$'::text, ''::text) AS model_group,
            COALESCE("substring"(m.name, '[-@]seed([0-9]+)$'::text)::integer, 0) AS seed,
            c.step,
            s_1.config_id,
            e.value ->> 'op'::text AS op,
            e.value ->> 'family'::text AS family,
            (e.value ->> 'labelled_top'::text)::integer AS labelled_top,
            (e.value ->> 'n_top'::text)::integer AS n_top,
            (e.value ->> 'share_top'::text)::real AS share_top,
            ((e.value -> 'ci_top'::text) ->> 0)::real AS share_top_lo,
            ((e.value -> 'ci_top'::text) ->> 1)::real AS share_top_hi,
            (e.value ->> 'labelled_layer'::text)::integer AS labelled_all,
            (e.value ->> 'n_layer'::text)::integer AS n_all,
            (e.value ->> 'share_layer'::text)::real AS share_all,
            ((e.value -> 'ci_layer'::text) ->> 0)::real AS share_all_lo,
            ((e.value -> 'ci_layer'::text) ->> 1)::real AS share_all_hi,
            s_1.layers,
            c.model_id,
            s_1.checkpoint_id
           FROM checkpoint_summary s_1
             CROSS JOIN LATERAL jsonb_array_elements(COALESCE(s_1.enrichment, '[]'::jsonb)) e(value)
             JOIN checkpoint c ON c.id = s_1.checkpoint_id
             JOIN model m ON m.id = c.model_id
          WHERE (e.value ->> 'layer'::text) = 'all'::text
        ), families AS (
         SELECT DISTINCT stored.model_group,
            stored.config_id,
            stored.op,
            stored.family
           FROM stored
        ), points AS (
         SELECT DISTINCT ON (stored.checkpoint_id, stored.config_id, stored.op) stored.model,
            stored.model_group,
            stored.seed,
            stored.step,
            stored.config_id,
            stored.op,
            stored.n_top,
            stored.n_all,
            stored.layers,
            stored.model_id,
            stored.checkpoint_id
           FROM stored
          ORDER BY stored.checkpoint_id, stored.config_id, stored.op, stored.family
        )
 SELECT p.model,
    p.model_group,
    p.seed,
    p.step,
    p.config_id,
    p.op,
    f.family,
    COALESCE(s.labelled_top, 0) AS labelled_top,
    p.n_top,
    COALESCE(s.share_top, 0::real) AS share_top,
    COALESCE(s.share_top_lo, 0::real) AS share_top_lo,
    COALESCE(s.share_top_hi,
        CASE
            WHEN p.n_top > 0 THEN 3.841458820694124 / (p.n_top::numeric + 3.841458820694124)
            ELSE NULL::numeric
        END::real) AS share_top_hi,
    COALESCE(s.labelled_all, 0) AS labelled_all,
    p.n_all,
    COALESCE(s.share_all, 0::real) AS share_all,
    COALESCE(s.share_all_lo, 0::real) AS share_all_lo,
    COALESCE(s.share_all_hi,
        CASE
            WHEN p.n_all > 0 THEN 3.841458820694124 / (p.n_all::numeric + 3.841458820694124)
            ELSE NULL::numeric
        END::real) AS share_all_hi,
    p.layers,
    p.model_id,
    p.checkpoint_id
   FROM points p
     JOIN families f ON f.model_group = p.model_group AND f.config_id = p.config_id AND f.op = p.op
     LEFT JOIN stored s ON s.checkpoint_id = p.checkpoint_id AND s.config_id = p.config_id AND s.op = p.op AND s.family = f.family;
-- grants on heuristic_share: {OWNER=arwdDxt/OWNER,catalog_reader=r/OWNER}

CREATE VIEW label_enrichment AS
 WITH labelled AS (
         SELECT DISTINCT neuron_score.model_id,
            neuron_score.checkpoint_id,
            neuron_score.config_id,
            neuron_score.layer,
            neuron_score.neuron,
            neuron_score.op
           FROM neuron_score
          WHERE neuron_score.implements
        ), neurons AS (
         SELECT n.model_id,
            n.checkpoint_id,
            n.config_id,
            n.layer,
            n.op,
            n.neuron,
            n.rank,
            l.neuron IS NOT NULL AS labelled,
            GREATEST(1::double precision, ceil(COALESCE((mc.config ->> 'top_set_fraction'::text)::double precision, 0.05::double precision) * count(*) OVER (PARTITION BY n.model_id, n.checkpoint_id, n.config_id, n.layer, n.op)::double precision))::integer AS n_top
           FROM neuron_op n
             JOIN measure_config mc ON mc.id = n.config_id
             LEFT JOIN labelled l ON l.model_id = n.model_id AND l.checkpoint_id = n.checkpoint_id AND l.config_id = n.config_id AND l.layer = n.layer AND l.neuron = n.neuron AND l.op::text = n.op::text
        ), counted AS (
         SELECT neurons.model_id,
            neurons.checkpoint_id,
            neurons.config_id,
            neurons.layer,
            neurons.op,
            count(*) AS n_layer,
            count(*) FILTER (WHERE neurons.rank < neurons.n_top) AS n_top,
            count(*) FILTER (WHERE neurons.rank < neurons.n_top AND neurons.labelled) AS labelled_top,
            count(*) FILTER (WHERE neurons.labelled) AS labelled_layer
           FROM neurons
          GROUP BY neurons.model_id, neurons.checkpoint_id, neurons.config_id, neurons.layer, neurons.op
        )
 SELECT m.name AS model,
    c.step,
    k.config_id,
    k.layer,
    k.op,
    k.n_top,
    k.labelled_top,
    k.labelled_top::double precision / NULLIF(k.n_top, 0)::double precision AS share_top,
    wilson_low(k.labelled_top, k.n_top) AS share_top_low,
    wilson_high(k.labelled_top, k.n_top) AS share_top_high,
    k.n_layer - k.n_top AS n_rest,
    k.labelled_layer - k.labelled_top AS labelled_rest,
    (k.labelled_layer - k.labelled_top)::double precision / NULLIF(k.n_layer - k.n_top, 0)::double precision AS share_rest,
    wilson_low(k.labelled_layer - k.labelled_top, k.n_layer - k.n_top) AS share_rest_low,
    wilson_high(k.labelled_layer - k.labelled_top, k.n_layer - k.n_top) AS share_rest_high,
    k.n_layer,
    k.labelled_layer,
    k.labelled_layer::double precision / NULLIF(k.n_layer, 0)::double precision AS share_layer,
    k.model_id,
    k.checkpoint_id
   FROM counted k
     JOIN model m ON m.id = k.model_id
     JOIN checkpoint c ON c.id = k.checkpoint_id;
-- grants on label_enrichment: {OWNER=arwdDxt/OWNER,catalog_reader=r/OWNER}

CREATE VIEW map_explanation AS
 SELECT m.name AS model,
    c.step,
    n.config_id,
    n.layer,
    n.neuron,
    n.op,
    n.fit_operands,
    n.fit_result,
    n.fit_joint,
    n.fit_other,
    n.fit_other_op,
    n.kv_fit_operands,
    n.kv_fit_result,
    n.kv_fit_joint,
    n.kv_fit_other,
    n.kv_fit_other_op,
    n.kv_fit_joint - n.kv_fit_operands AS kv_result_beyond_operands,
    n.kv_fit_joint - n.kv_fit_other AS kv_result_over_rival,
        CASE
            WHEN n.kv_fit_other > n.kv_fit_joint THEN 'rival'::text
            WHEN (n.kv_fit_joint - n.kv_fit_operands) < 0.01::double precision THEN 'operands'::text
            ELSE 'result'::text
        END AS best_explanation,
    (EXISTS ( SELECT 1
           FROM neuron_score s
             JOIN heuristic h ON h.id = s.heuristic_id
          WHERE s.model_id = n.model_id AND s.checkpoint_id = n.checkpoint_id AND s.config_id = n.config_id AND s.layer = n.layer AND s.neuron = n.neuron AND s.op::text = n.op::text AND s.implements AND h.target::text = 'result'::text)) AS result_label,
    n.model_id,
    n.checkpoint_id
   FROM neuron_op n
     JOIN model m ON m.id = n.model_id
     JOIN checkpoint c ON c.id = n.checkpoint_id
  WHERE n.kv_fit_joint IS NOT NULL;
-- grants on map_explanation: {OWNER=arwdDxt/OWNER,catalog_reader=r/OWNER}

CREATE VIEW neuron_counterparts AS
 SELECT fm.name AS model,
    fc.step,
    tm.name AS other_model,
    tc.step AS other_step,
    n.config_id,
    n.layer,
    n.neuron,
    n.best_layer,
    n.best_neuron,
    n.best_similarity,
    n.one_to_one_layer,
    n.one_to_one_neuron,
    n.one_to_one_similarity,
    n.null_threshold,
    n.level,
    n.has_counterpart,
    n.best_layer = n.layer AND n.best_neuron = n.neuron AS same_index,
    n.null_models,
    n.n_cells,
    n.written_at,
    fc.model_id,
    n.from_checkpoint_id,
    tc.model_id AS other_model_id,
    n.to_checkpoint_id
   FROM neuron_counterpart n
     JOIN checkpoint fc ON fc.id = n.from_checkpoint_id
     JOIN model fm ON fm.id = fc.model_id
     JOIN checkpoint tc ON tc.id = n.to_checkpoint_id
     JOIN model tm ON tm.id = tc.model_id;
-- grants on neuron_counterparts: {OWNER=arwdDxt/OWNER,catalog_reader=r/OWNER}

CREATE VIEW neuron_evolution AS
 SELECT m.name AS model,
    c.step,
    n.layer,
    n.neuron,
    n.op,
    n.config_id,
    n.effect_exact,
    n.effect_attr,
    n.rank,
    n.max_act,
    n.density,
    h.label AS best_heuristic,
    h.family AS best_family,
    n.best_score,
    n.model_id,
    n.checkpoint_id,
    n.rank_value,
    n.effect_trimmed,
    n.effect_median,
    n.moved_share,
    n.is_exact,
    n.constant,
    n.best_bottom,
    n.labelled
   FROM neuron_op n
     JOIN checkpoint c ON c.id = n.checkpoint_id
     JOIN model m ON m.id = n.model_id
     LEFT JOIN heuristic h ON h.id = n.best_heuristic_id;
-- grants on neuron_evolution: {OWNER=arwdDxt/OWNER,catalog_reader=r/OWNER}

CREATE VIEW neuron_spectrum AS
 SELECT m.name AS model,
    c.step,
    n.config_id,
    n.layer,
    n.neuron,
    n.op,
    n.op1_spec / 300 AS op1_period,
    (n.op1_spec::integer % 300)::double precision / 299::double precision AS op1_share,
    (n.spec_helix::integer & 1) <> 0 AS op1_periodic,
    n.op2_spec / 300 AS op2_period,
    (n.op2_spec::integer % 300)::double precision / 299::double precision AS op2_share,
    (n.spec_helix::integer & 2) <> 0 AS op2_periodic,
    n.result_spec / 300 AS result_period,
    (n.result_spec::integer % 300)::double precision / 299::double precision AS result_share,
    (n.spec_helix::integer & 4) <> 0 AS result_periodic,
    n.kv_spec / 300 AS kv_period,
    (n.kv_spec::integer % 300)::double precision / 299::double precision AS kv_share,
    (n.spec_helix::integer & 8) <> 0 AS kv_periodic,
    (n.op1_fitlin / 181)::double precision / 180::double precision AS op1_fit,
    (n.op2_fitlin / 181)::double precision / 180::double precision AS op2_fit,
    (n.result_fitlin / 181)::double precision / 180::double precision AS result_fit,
    (n.op1_fitlin::integer % 181)::double precision / 180::double precision AS op1_linear,
    (n.op2_fitlin::integer % 181)::double precision / 180::double precision AS op2_linear,
    (n.result_fitlin::integer % 181)::double precision / 180::double precision AS result_linear,
    (n.spec_helix >> 4)::double precision / 2000::double precision AS helix_r2,
    n.model_id,
    n.checkpoint_id
   FROM neuron_op n
     JOIN model m ON m.id = n.model_id
     JOIN checkpoint c ON c.id = n.checkpoint_id
  WHERE n.spec_helix IS NOT NULL AND NOT COALESCE(n.constant, false);
-- grants on neuron_spectrum: {OWNER=arwdDxt/OWNER,catalog_reader=r/OWNER}

CREATE VIEW period_distribution AS
 WITH maps AS (
         SELECT n.model_id,
            n.checkpoint_id,
            n.config_id,
            n.layer,
            n.op,
            a.axis,
            a.period,
            a.periodic
           FROM neuron_op n
             CROSS JOIN LATERAL ( VALUES ('op1'::text,n.op1_spec / 300,(n.spec_helix::integer & 1) <> 0), ('op2'::text,n.op2_spec / 300,(n.spec_helix::integer & 2) <> 0), ('result'::text,n.result_spec / 300,(n.spec_helix::integer & 4) <> 0), ('kv'::text,n.kv_spec / 300,(n.spec_helix::integer & 8) <> 0)) a(axis, period, periodic)
          WHERE n.spec_helix IS NOT NULL AND NOT COALESCE(n.constant, false)
        ), live AS (
         SELECT maps.model_id,
            maps.checkpoint_id,
            maps.config_id,
            maps.layer,
            maps.op,
            maps.axis,
            count(*) AS n_live,
            count(*) FILTER (WHERE maps.periodic) AS n_periodic
           FROM maps
          GROUP BY maps.model_id, maps.checkpoint_id, maps.config_id, maps.layer, maps.op, maps.axis
        ), by_period AS (
         SELECT maps.model_id,
            maps.checkpoint_id,
            maps.config_id,
            maps.layer,
            maps.op,
            maps.axis,
            maps.period,
            count(*) AS n
           FROM maps
          WHERE maps.periodic
          GROUP BY maps.model_id, maps.checkpoint_id, maps.config_id, maps.layer, maps.op, maps.axis, maps.period
        )
 SELECT md.name AS model,
    c.step,
    l.config_id,
    l.layer,
    l.op,
    l.axis,
    p.period,
    COALESCE(p.n, 0::bigint) AS n,
    l.n_periodic,
    l.n_live,
    COALESCE(p.n, 0::bigint)::double precision / NULLIF(l.n_live, 0)::double precision AS share,
    wilson_low(COALESCE(p.n, 0::bigint), l.n_live) AS share_low,
    wilson_high(COALESCE(p.n, 0::bigint), l.n_live) AS share_high,
    l.model_id,
    l.checkpoint_id
   FROM live l
     LEFT JOIN by_period p USING (model_id, checkpoint_id, config_id, layer, op, axis)
     JOIN model md ON md.id = l.model_id
     JOIN checkpoint c ON c.id = l.checkpoint_id;
-- grants on period_distribution: {OWNER=arwdDxt/OWNER,catalog_reader=r/OWNER}

CREATE VIEW period_label_overlap AS
 WITH live AS (
         SELECT n.model_id,
            n.checkpoint_id,
            n.config_id,
            n.layer,
            n.neuron,
            n.op,
            (n.spec_helix::integer & 1) <> 0 AS p1,
            (n.spec_helix::integer & 2) <> 0 AS p2,
            (n.spec_helix::integer & 4) <> 0 AS pr,
            n.op1_spec / 300 AS op1_period,
            n.op2_spec / 300 AS op2_period,
            n.result_spec / 300 AS result_period,
            (n.op1_spec::integer % 300)::double precision / 299::double precision AS op1_share,
            (n.op2_spec::integer % 300)::double precision / 299::double precision AS op2_share,
            (n.result_spec::integer % 300)::double precision / 299::double precision AS result_share,
            (n.op1_fitlin::integer % 181)::double precision / 180::double precision AS op1_linear,
            (n.op2_fitlin::integer % 181)::double precision / 180::double precision AS op2_linear,
            (n.result_fitlin::integer % 181)::double precision / 180::double precision AS result_linear
           FROM neuron_op n
          WHERE n.spec_helix IS NOT NULL AND NOT COALESCE(n.constant, false)
        ), axis AS (
         SELECT l.model_id,
            l.checkpoint_id,
            l.config_id,
            l.layer,
            l.neuron,
            l.op,
            a.target,
            a.period,
            a.periodic,
            a.share,
            a.linear
           FROM live l
             CROSS JOIN LATERAL ( VALUES ('op1'::text,l.op1_period,l.p1,l.op1_share,l.op1_linear), ('op2'::text,l.op2_period,l.p2,l.op2_share,l.op2_linear), ('result'::text,l.result_period,l.pr,l.result_share,l.result_linear)) a(target, period, periodic, share, linear)
        ), labels AS (
         SELECT s.model_id,
            s.checkpoint_id,
            s.config_id,
            s.layer,
            s.neuron,
            s.op,
            h.family,
            h.target,
                CASE
                    WHEN h.family::text = 'modulo'::text THEN (h.params ->> 0)::integer
                    ELSE NULL::integer
                END AS modulus
           FROM neuron_score s
             JOIN heuristic h ON h.id = s.heuristic_id
          WHERE s.implements AND (h.family::text = ANY (ARRAY['modulo'::character varying, 'range'::character varying]::text[]))
        ), matched AS (
         SELECT DISTINCT l.model_id,
            l.checkpoint_id,
            l.config_id,
            l.layer,
            l.neuron,
            l.op,
            l.family,
            l.target,
            bool_or(
                CASE
                    WHEN l.family::text = 'modulo'::text THEN a.periodic AND (l.modulus % a.period) = 0
                    ELSE a.linear > a.share
                END) OVER (PARTITION BY l.model_id, l.checkpoint_id, l.config_id, l.layer, l.neuron, l.op, l.family, l.target) AS agrees
           FROM labels l
             JOIN axis a USING (model_id, checkpoint_id, config_id, layer, neuron, op, target)
        ), layers AS (
         SELECT DISTINCT matched.model_id,
            matched.checkpoint_id,
            matched.config_id,
            matched.op,
            matched.family,
            matched.target,
            matched.layer
           FROM matched
        ), base AS (
         SELECT y.model_id,
            y.checkpoint_id,
            y.config_id,
            y.op,
            y.family,
            y.target,
            count(*) AS n_live,
            count(*) FILTER (WHERE
                CASE
                    WHEN y.family::text = 'modulo'::text THEN a.periodic
                    ELSE a.linear > a.share
                END) AS n_base
           FROM layers y
             JOIN axis a ON a.model_id = y.model_id AND a.checkpoint_id = y.checkpoint_id AND a.config_id = y.config_id AND a.op::text = y.op::text AND a.layer = y.layer AND a.target = y.target::text
          GROUP BY y.model_id, y.checkpoint_id, y.config_id, y.op, y.family, y.target
        ), counted AS (
         SELECT matched.model_id,
            matched.checkpoint_id,
            matched.config_id,
            matched.op,
            matched.family,
            matched.target,
            count(*) AS n_labelled,
            count(*) FILTER (WHERE matched.agrees) AS n_agree
           FROM matched
          GROUP BY matched.model_id, matched.checkpoint_id, matched.config_id, matched.op, matched.family, matched.target
        )
 SELECT md.name AS model,
    c.step,
    k.config_id,
    k.op,
    k.family,
    k.target,
        CASE k.family
            WHEN 'modulo'::text THEN 'periodic, period dividing the modulus'::text
            ELSE 'magnitude: a line explains more than any period'::text
        END AS agreement,
    k.n_labelled,
    k.n_agree,
    k.n_agree::double precision / NULLIF(k.n_labelled, 0)::double precision AS share,
    wilson_low(k.n_agree, k.n_labelled) AS share_low,
    wilson_high(k.n_agree, k.n_labelled) AS share_high,
    b.n_live,
    b.n_base,
    b.n_base::double precision / NULLIF(b.n_live, 0)::double precision AS base_rate,
    k.model_id,
    k.checkpoint_id
   FROM counted k
     JOIN base b USING (model_id, checkpoint_id, config_id, op, family, target)
     JOIN model md ON md.id = k.model_id
     JOIN checkpoint c ON c.id = k.checkpoint_id;
-- grants on period_label_overlap: {OWNER=arwdDxt/OWNER,catalog_reader=r/OWNER}

CREATE VIEW prompt_explanations AS
 SELECT m.name AS model,
    c.step,
    e.config_id,
    e.prompt,
    e.op,
    e.a,
    e.b,
    e.result,
    e.predicted,
    e.correct,
    e.p_answer,
    e.rank_answer,
    e.target,
    e.share_holds,
    e.share_labelled_other,
    e.share_other_neurons,
    e.share_heads,
    e.share_rest,
    e.neurons_50,
    e.neurons_80,
    e.heuristics_in_80,
    e.labelled,
    e.n_knocked,
    e.p_knocked,
    e.p_random,
    e.p_random_se,
    e.written_at,
    e.model_id,
    e.checkpoint_id,
    (e.explanation -> 'knockout'::text) ->> 'ranking'::text AS knockout_ranking,
    (((e.explanation -> 'knockout'::text) -> 'label_adds'::text) ->> 'unlabelled'::text)::double precision AS label_adds_unlabelled,
    (((e.explanation -> 'knockout'::text) -> 'label_adds'::text) ->> 'not holding'::text)::double precision AS label_adds_not_holding
   FROM prompt_explanation e
     JOIN model m ON m.id = e.model_id
     JOIN checkpoint c ON c.id = e.checkpoint_id;
-- grants on prompt_explanations: {OWNER=arwdDxt/OWNER,catalog_reader=r/OWNER}

CREATE OR REPLACE FUNCTION public.emergence_histogram_track()
 RETURNS trigger
 LANGUAGE plpgsql
AS $function$
    BEGIN
      -- each branch names only the transition tables its trigger defines
      IF TG_OP = 'INSERT' THEN
      INSERT INTO emergence_histogram AS e (model, model_id, config_id, op, family, emergence_step, pairs)
      SELECT coalesce(m.name, ''), d.model_id, d.config_id, d.op, d.family,
             d.emergence_step, d.n
      FROM (SELECT r.model_id, r.config_id, r.op, h.family, r.emergence_step,
                   sum(r.d) AS n
            FROM (SELECT model_id, config_id, op, heuristic_id, emergence_step, 1 AS d FROM new_runs) r JOIN heuristic h ON h.id = r.heuristic_id
            GROUP BY r.model_id, r.config_id, r.op, h.family, r.emergence_step
            HAVING sum(r.d) <> 0) d
      LEFT JOIN model m ON m.id = d.model_id
      ON CONFLICT (model_id, config_id, op, family, emergence_step) DO UPDATE SET pairs = e.pairs + EXCLUDED.pairs;
      DELETE FROM emergence_histogram e
      WHERE e.pairs = 0 AND e.model_id IN (SELECT DISTINCT r.model_id FROM (SELECT model_id, config_id, op, heuristic_id, emergence_step, 1 AS d FROM new_runs) r);
      ELSIF TG_OP = 'DELETE' THEN
      INSERT INTO emergence_histogram AS e (model, model_id, config_id, op, family, emergence_step, pairs)
      SELECT coalesce(m.name, ''), d.model_id, d.config_id, d.op, d.family,
             d.emergence_step, d.n
      FROM (SELECT r.model_id, r.config_id, r.op, h.family, r.emergence_step,
                   sum(r.d) AS n
            FROM (SELECT model_id, config_id, op, heuristic_id, emergence_step, -1 AS d FROM old_runs) r JOIN heuristic h ON h.id = r.heuristic_id
            GROUP BY r.model_id, r.config_id, r.op, h.family, r.emergence_step
            HAVING sum(r.d) <> 0) d
      LEFT JOIN model m ON m.id = d.model_id
      ON CONFLICT (model_id, config_id, op, family, emergence_step) DO UPDATE SET pairs = e.pairs + EXCLUDED.pairs;
      DELETE FROM emergence_histogram e
      WHERE e.pairs = 0 AND e.model_id IN (SELECT DISTINCT r.model_id FROM (SELECT model_id, config_id, op, heuristic_id, emergence_step, -1 AS d FROM old_runs) r);
      ELSIF TG_OP = 'UPDATE' THEN
      INSERT INTO emergence_histogram AS e (model, model_id, config_id, op, family, emergence_step, pairs)
      SELECT coalesce(m.name, ''), d.model_id, d.config_id, d.op, d.family,
             d.emergence_step, d.n
      FROM (SELECT r.model_id, r.config_id, r.op, h.family, r.emergence_step,
                   sum(r.d) AS n
            FROM (SELECT model_id, config_id, op, heuristic_id, emergence_step, 1 AS d FROM new_runs UNION ALL SELECT model_id, config_id, op, heuristic_id, emergence_step, -1 AS d FROM old_runs) r JOIN heuristic h ON h.id = r.heuristic_id
            GROUP BY r.model_id, r.config_id, r.op, h.family, r.emergence_step
            HAVING sum(r.d) <> 0) d
      LEFT JOIN model m ON m.id = d.model_id
      ON CONFLICT (model_id, config_id, op, family, emergence_step) DO UPDATE SET pairs = e.pairs + EXCLUDED.pairs;
      DELETE FROM emergence_histogram e
      WHERE e.pairs = 0 AND e.model_id IN (SELECT DISTINCT r.model_id FROM (SELECT model_id, config_id, op, heuristic_id, emergence_step, 1 AS d FROM new_runs UNION ALL SELECT model_id, config_id, op, heuristic_id, emergence_step, -1 AS d FROM old_runs) r);
      ELSE  -- TRUNCATE
        DELETE FROM emergence_histogram;
      END IF;
      RETURN NULL;
    END $function$;

CREATE OR REPLACE FUNCTION public.p_decade(p double precision)
 RETURNS smallint
 LANGUAGE sql
 IMMUTABLE
AS $function$
      SELECT (CASE WHEN p < 1e-15 THEN -16  -- pooled (NULL stays NULL)
              ELSE width_bucket(p, ARRAY[1e-16, 1e-15, 1e-14, 1e-13, 1e-12, 1e-11, 1e-10, 1e-9, 1e-8, 1e-7, 1e-6, 1e-5, 1e-4, 1e-3, 1e-2, 1e-1, 1e0]::float8[]) - 17 END)::smallint
    $function$;

CREATE OR REPLACE FUNCTION public.refresh_catalog_views(p_model integer DEFAULT NULL::integer)
 RETURNS void
 LANGUAGE plpgsql
 SET jit TO 'off'
AS $function$
    BEGIN
      -- one refresher per model at a time (all models: every refresher waits)
      PERFORM pg_advisory_xact_lock(20260009, coalesce(p_model, 0));
      DELETE FROM heuristic_census WHERE p_model IS NULL OR model_id = p_model;
      INSERT INTO heuristic_census 
        SELECT m.name AS model, c.step, n.config_id, n.op, h.family,
               count(DISTINCT (n.layer, n.neuron)) AS circuit_neurons,
               n.model_id, n.checkpoint_id
        FROM neuron_op n
        JOIN neuron_score s ON s.model_id = n.model_id AND s.checkpoint_id = n.checkpoint_id
             AND s.config_id = n.config_id AND s.layer = n.layer AND s.neuron = n.neuron
             AND s.op = n.op
        JOIN heuristic h ON h.id = s.heuristic_id
        JOIN checkpoint c ON c.id = n.checkpoint_id
        JOIN model m ON m.id = n.model_id
        WHERE n.rank < (SELECT value FROM catalog_setting WHERE key = 'circuit_k') AND coalesce(s.implements, s.score >= (SELECT value FROM catalog_setting WHERE key = 'match_threshold')) AND (p_model IS NULL OR n.model_id = p_model) AND (p_model IS NULL OR s.model_id = p_model)
        GROUP BY m.name, c.step, n.config_id, n.op, h.family, n.model_id, n.checkpoint_id;
      DELETE FROM checkpoint_overlap WHERE p_model IS NULL OR model_id = p_model;
      INSERT INTO checkpoint_overlap 
        WITH ck AS (
            SELECT DISTINCT c.model_id, lr.config_id, c.id AS checkpoint_id, c.step
            FROM layer_result lr JOIN checkpoint c ON c.id = lr.checkpoint_id
            WHERE (p_model IS NULL OR c.model_id = p_model)),
        final AS (
            SELECT DISTINCT ON (model_id, config_id) model_id, config_id, checkpoint_id
            FROM ck ORDER BY model_id, config_id, step DESC NULLS FIRST),
        final_pairs AS (
            SELECT s.model_id, s.config_id, s.layer, s.neuron, s.op, s.heuristic_id
            FROM neuron_score s
            JOIN final f ON f.model_id = s.model_id AND f.config_id = s.config_id
                        AND f.checkpoint_id = s.checkpoint_id
            JOIN neuron_op n ON n.model_id = s.model_id AND n.checkpoint_id = s.checkpoint_id
                 AND n.config_id = s.config_id AND n.layer = s.layer AND n.neuron = s.neuron
                 AND n.op = s.op
            WHERE coalesce(s.implements, s.score >= (SELECT value FROM catalog_setting WHERE key = 'match_threshold')) AND n.rank < (SELECT value FROM catalog_setting WHERE key = 'circuit_k') AND (p_model IS NULL OR s.model_id = p_model)
                  AND (p_model IS NULL OR n.model_id = p_model)),
        totals AS (
            SELECT model_id, config_id, count(*) AS n FROM final_pairs
            GROUP BY model_id, config_id),
        present AS (
            SELECT s.model_id, s.config_id, s.checkpoint_id, count(*) AS n
            FROM final_pairs fp
            JOIN neuron_score s ON s.model_id = fp.model_id AND s.config_id = fp.config_id
                 AND s.layer = fp.layer AND s.neuron = fp.neuron AND s.op = fp.op
                 AND s.heuristic_id = fp.heuristic_id
            WHERE coalesce(s.implements, s.score >= (SELECT value FROM catalog_setting WHERE key = 'match_threshold')) AND (p_model IS NULL OR s.model_id = p_model)
            GROUP BY s.model_id, s.config_id, s.checkpoint_id)
        SELECT m.name AS model, ck.step, ck.config_id, t.n AS final_pairs,
               coalesce(p.n, 0) AS present,
               coalesce(p.n, 0)::real / nullif(t.n, 0) AS share,
               ck.model_id, ck.checkpoint_id
        FROM ck
        JOIN totals t ON t.model_id = ck.model_id AND t.config_id = ck.config_id
        LEFT JOIN present p ON p.model_id = ck.model_id AND p.config_id = ck.config_id
                           AND p.checkpoint_id = ck.checkpoint_id
        JOIN model m ON m.id = ck.model_id;
      DELETE FROM emergence_run WHERE p_model IS NULL OR model_id = p_model;
      INSERT INTO emergence_run (model_id, config_id, layer, neuron, op, heuristic_id,
                                 emergence_step)
      SELECT model_id, config_id, layer, neuron, op, heuristic_id, emergence_step
      FROM (
        WITH ck AS (
            SELECT c.model_id, lr.config_id, lr.layer, c.id AS checkpoint_id, c.step,
                   row_number() OVER (PARTITION BY c.model_id, lr.config_id, lr.layer
                                      ORDER BY c.step DESC NULLS FIRST) AS rn
            FROM layer_result lr JOIN checkpoint c ON c.id = lr.checkpoint_id
            WHERE (p_model IS NULL OR c.model_id = p_model)),
        held AS (
            SELECT s.model_id, s.config_id, s.layer, s.neuron, s.op, s.heuristic_id,
                   ck.step, ck.rn,
                   row_number() OVER (PARTITION BY s.model_id, s.config_id, s.layer,
                                      s.neuron, s.op, s.heuristic_id ORDER BY ck.rn) AS k
            FROM neuron_score s
            JOIN ck ON ck.checkpoint_id = s.checkpoint_id AND ck.config_id = s.config_id
                   AND ck.layer = s.layer
            WHERE coalesce(s.implements, s.score >= (SELECT value FROM catalog_setting WHERE key = 'match_threshold')) AND (p_model IS NULL OR s.model_id = p_model)),
        runs AS (
            SELECT model_id, config_id, layer, neuron, op, heuristic_id,
                   min(step) AS emergence_step, count(*) AS checkpoints_held
            FROM held WHERE rn = k
            GROUP BY model_id, config_id, layer, neuron, op, heuristic_id)
        SELECT m.name AS model, r.layer, r.neuron, r.op, r.config_id, h.label AS heuristic,
               h.family, r.emergence_step, r.checkpoints_held, r.model_id, r.heuristic_id
        FROM runs r
        JOIN model m ON m.id = r.model_id
        JOIN heuristic h ON h.id = r.heuristic_id) e;
      DELETE FROM label_histogram WHERE p_model IS NULL OR model_id = p_model;
      INSERT INTO label_histogram 
    SELECT m.name AS model, c.step, s.config_id, s.op, h.family,
           score_bin(s.score) AS score_from, p_decade(s.p_value) AS p_decade,
           count(*) AS labels, sum(s.base_rate::float8) AS base_rate_sum,
           count(s.base_rate) AS base_rates, s.model_id, s.checkpoint_id
    FROM neuron_score s
    JOIN heuristic h ON h.id = s.heuristic_id
    JOIN checkpoint c ON c.id = s.checkpoint_id
    JOIN model m ON m.id = s.model_id
    WHERE coalesce(s.implements, s.score >= (SELECT value FROM catalog_setting WHERE key = 'match_threshold')) AND (p_model IS NULL OR s.model_id = p_model)
    GROUP BY m.name, c.step, s.config_id, s.op, h.family, score_bin(s.score),
             p_decade(s.p_value), s.model_id, s.checkpoint_id;
      DELETE FROM derived_layer WHERE p_model IS NULL OR model_id = p_model;
      INSERT INTO derived_layer (model_id, checkpoint_id, config_id, layer, written_at)
      SELECT c.model_id, lr.checkpoint_id, lr.config_id, lr.layer, lr.written_at
      FROM layer_result lr JOIN checkpoint c ON c.id = lr.checkpoint_id
      WHERE (p_model IS NULL OR c.model_id = p_model);
    END $function$;

CREATE OR REPLACE FUNCTION public.refresh_checkpoint_views(p_model integer, p_checkpoint integer, p_config integer)
 RETURNS text
 LANGUAGE plpgsql
 SET jit TO 'off'
 SET work_mem TO '256MB'
 SET enable_mergejoin TO 'off'
 SET enable_nestloop TO 'on'
AS $function$
    DECLARE
      v_step bigint;
      v_final integer;
      v_new smallint[];
      v_top smallint[];
      v_mid smallint[];
      v_k integer;
      v_count bigint;
    BEGIN
      -- one refresher per model at a time (the full rebuild takes the same lock)
      PERFORM pg_advisory_xact_lock(20260009, p_model);
      SELECT step INTO v_step FROM checkpoint WHERE id = p_checkpoint AND model_id = p_model;
      IF NOT FOUND THEN
        RAISE EXCEPTION 'checkpoint % is not a checkpoint of model %', p_checkpoint, p_model;
      END IF;
      -- this checkpoint's layers written since they were last folded in
      SELECT coalesce(array_agg(lr.layer ORDER BY lr.layer), '{}') INTO v_new
      FROM layer_result lr
      LEFT JOIN derived_layer d ON d.checkpoint_id = lr.checkpoint_id
           AND d.config_id = lr.config_id AND d.layer = lr.layer
      WHERE lr.checkpoint_id = p_checkpoint AND lr.config_id = p_config
        AND d.written_at IS DISTINCT FROM lr.written_at;
      IF cardinality(v_new) = 0 THEN
        RETURN 'nothing new';
      END IF;
      -- a layer written again changes labels already folded in; a model without steps has
      -- one checkpoint: both are rebuilt whole
      IF v_step IS NULL
         OR EXISTS (SELECT 1 FROM derived_layer d WHERE d.checkpoint_id = p_checkpoint
                    AND d.config_id = p_config AND d.layer = ANY (v_new))
         OR EXISTS (SELECT 1 FROM derived_layer d JOIN checkpoint c ON c.id = d.checkpoint_id
                    WHERE d.model_id = p_model AND c.step IS NULL) THEN
        PERFORM refresh_catalog_views(p_model);
        RETURN 'rebuilt';
      END IF;

      DELETE FROM heuristic_census
      WHERE model_id = p_model AND checkpoint_id = p_checkpoint AND config_id = p_config;
      v_k := (SELECT ceil(value)::integer FROM catalog_setting WHERE key = 'circuit_k');
      EXECUTE $q$INSERT INTO heuristic_census 
    SELECT m.name AS model, c.step, n.config_id, n.op, h.family,
           count(DISTINCT (n.layer, n.neuron)) AS circuit_neurons,
           n.model_id, n.checkpoint_id
    FROM neuron_op n
    JOIN neuron_score s ON s.model_id = n.model_id AND s.checkpoint_id = n.checkpoint_id
         AND s.config_id = n.config_id AND s.layer = n.layer AND s.neuron = n.neuron
         AND s.op = n.op
    JOIN heuristic h ON h.id = s.heuristic_id
    JOIN checkpoint c ON c.id = n.checkpoint_id
    JOIN model m ON m.id = n.model_id
    WHERE n.rank < $4 AND coalesce(s.implements, s.score >= (SELECT value FROM catalog_setting WHERE key = 'match_threshold')) AND n.model_id = $1 AND n.checkpoint_id = $3 AND n.config_id = $2 AND s.model_id = $1
    GROUP BY m.name, c.step, n.config_id, n.op, h.family, n.model_id, n.checkpoint_id$q$ USING p_model, p_config, p_checkpoint, v_k;
      DELETE FROM label_histogram
      WHERE model_id = p_model AND checkpoint_id = p_checkpoint AND config_id = p_config;

      -- per new layer: is this step after the layer's last folded step (or the first)?
      SELECT coalesce(array_agg(l) FILTER (WHERE last IS NULL OR v_step > last), '{}'),
             coalesce(array_agg(l) FILTER (WHERE v_step < last), '{}')
      INTO v_top, v_mid
      FROM (SELECT l, (SELECT max(c.step) FROM derived_layer d
                       JOIN checkpoint c ON c.id = d.checkpoint_id
                       WHERE d.model_id = p_model AND d.config_id = p_config
                         AND d.layer = l) AS last
            FROM unnest(v_new) l) q;
      -- the checkpoint's labels are read once (the scan of its scores is the one cost that
      -- grows with the model's width); everything below joins them by hash, whatever the
      -- statistics say: right after a rebuild or a bulk write they are stale, and a nested
      -- loop over the labels planned for "1 row" is quadratic (minutes at 786K labels)
      SET LOCAL enable_nestloop = off;  -- (the SET clause above keeps it to this function)
      WITH lab AS MATERIALIZED (
        SELECT s.layer, s.neuron, s.op, s.heuristic_id, s.score, s.p_value, s.base_rate
        FROM neuron_score s WHERE s.model_id = p_model AND s.checkpoint_id = p_checkpoint AND s.config_id = p_config AND coalesce(s.implements, s.score >= (SELECT value FROM catalog_setting WHERE key = 'match_threshold'))),
      histogram AS (
        INSERT INTO label_histogram
        SELECT m.name, v_step, p_config, l.op, h.family, score_bin(l.score),
               p_decade(l.p_value), count(*), sum(l.base_rate::float8), count(l.base_rate),
               p_model, p_checkpoint
        FROM lab l JOIN heuristic h ON h.id = l.heuristic_id JOIN model m ON m.id = p_model
        GROUP BY m.name, l.op, h.family, score_bin(l.score), p_decade(l.p_value)),
      -- a new last step: pairs it does not hold lose their run; pairs it holds keep theirs,
      -- or start one here (a pair that stays labelled is not written at all)
      dropped AS (
        DELETE FROM emergence_run r
        WHERE r.model_id = p_model AND r.config_id = p_config AND r.layer = ANY (v_top)
          AND NOT EXISTS (SELECT 1 FROM lab l WHERE l.layer = r.layer AND l.neuron = r.neuron
                    AND l.op = r.op AND l.heuristic_id = r.heuristic_id)),
      started AS (
        INSERT INTO emergence_run (model_id, config_id, layer, neuron, op, heuristic_id,
                                   emergence_step)
        SELECT p_model, p_config, l.layer, l.neuron, l.op, l.heuristic_id, v_step
        FROM lab l
        WHERE l.layer = ANY (v_top)
          AND NOT EXISTS (SELECT 1 FROM emergence_run r WHERE r.model_id = p_model
                          AND r.config_id = p_config AND r.layer = l.layer
                          AND r.neuron = l.neuron AND r.op = l.op
                          AND r.heuristic_id = l.heuristic_id)),
      -- a step between others: a pair it holds extends a run that starts just after it; a
      -- pair it does not hold breaks the run it falls inside, which then starts at the
      -- next step (runs it falls inside and holds just get longer: nothing to write)
      after AS (
        SELECT d.layer, min(c.step) AS next_step FROM derived_layer d
        JOIN checkpoint c ON c.id = d.checkpoint_id
        WHERE d.model_id = p_model AND d.config_id = p_config AND d.layer = ANY (v_mid)
          AND c.step > v_step
        GROUP BY d.layer),
      extended AS (  -- a join, not EXISTS: lab's pairs are unique, and so estimated
        UPDATE emergence_run r SET emergence_step = v_step FROM after a, lab l
        WHERE r.model_id = p_model AND r.config_id = p_config AND r.layer = a.layer
          AND r.emergence_step = a.next_step AND l.layer = r.layer AND l.neuron = r.neuron
          AND l.op = r.op AND l.heuristic_id = r.heuristic_id),
      broken AS (
        UPDATE emergence_run r SET emergence_step = a.next_step FROM after a
        WHERE r.model_id = p_model AND r.config_id = p_config AND r.layer = a.layer
          AND r.emergence_step < v_step AND NOT EXISTS (SELECT 1 FROM lab l WHERE l.layer = r.layer AND l.neuron = r.neuron
                    AND l.op = r.op AND l.heuristic_id = r.heuristic_id))
      -- the sub-statements share one snapshot and touch disjoint rows: dropped and started
      -- split the top layers' pairs by whether the step holds them, extended and broken
      -- the middle layers' runs by where they start
      SELECT count(*) INTO v_count FROM lab;
      SET LOCAL enable_nestloop = on;  -- the overlap below looks pairs up by index

      INSERT INTO derived_layer (model_id, checkpoint_id, config_id, layer, written_at)
      SELECT p_model, lr.checkpoint_id, lr.config_id, lr.layer, lr.written_at
      FROM layer_result lr
      WHERE lr.checkpoint_id = p_checkpoint AND lr.config_id = p_config
        AND lr.layer = ANY (v_new)
      ON CONFLICT (checkpoint_id, config_id, layer) DO UPDATE
      SET written_at = EXCLUDED.written_at;

      SELECT checkpoint_id INTO v_final FROM (
    SELECT DISTINCT d.checkpoint_id, c.step FROM derived_layer d
    JOIN checkpoint c ON c.id = d.checkpoint_id
    WHERE d.model_id = p_model AND d.config_id = p_config) f ORDER BY step DESC LIMIT 1;
      IF v_final = p_checkpoint THEN  -- the last step: every row against its circuit
        DELETE FROM checkpoint_overlap WHERE model_id = p_model AND config_id = p_config;
        EXECUTE $q$
    INSERT INTO checkpoint_overlap (model, step, config_id, final_pairs, present, share,
                                    model_id, checkpoint_id)
    WITH final_pairs AS MATERIALIZED (
        SELECT s.layer, s.neuron, s.op, s.heuristic_id
        FROM neuron_op n
        JOIN neuron_score s ON s.model_id = n.model_id AND s.checkpoint_id = n.checkpoint_id
             AND s.config_id = n.config_id AND s.layer = n.layer AND s.neuron = n.neuron
             AND s.op = n.op
        WHERE n.model_id = $1 AND n.checkpoint_id = $3 AND n.config_id = $2 AND n.rank < $4
              AND s.model_id = $1 AND coalesce(s.implements, s.score >= (SELECT value FROM catalog_setting WHERE key = 'match_threshold'))),
    total AS (SELECT count(*) AS n FROM final_pairs)
    SELECT m.name, ck.step, $2, t.n, p.n, p.n::real / nullif(t.n, 0), $1, ck.checkpoint_id
    FROM (
    SELECT DISTINCT d.checkpoint_id, c.step FROM derived_layer d
    JOIN checkpoint c ON c.id = d.checkpoint_id
    WHERE d.model_id = $1 AND d.config_id = $2) ck
    CROSS JOIN total t
    JOIN model m ON m.id = $1
    CROSS JOIN LATERAL (
        SELECT count(*) AS n FROM final_pairs fp
        JOIN neuron_score s ON s.model_id = $1 AND s.checkpoint_id = ck.checkpoint_id
             AND s.config_id = $2 AND s.layer = fp.layer AND s.neuron = fp.neuron
             AND s.op = fp.op AND s.heuristic_id = fp.heuristic_id
        WHERE coalesce(s.implements, s.score >= (SELECT value FROM catalog_setting WHERE key = 'match_threshold'))) p
    WHERE t.n > 0$q$ USING p_model, p_config, v_final, v_k;
      ELSE
        DELETE FROM checkpoint_overlap
        WHERE model_id = p_model AND checkpoint_id = p_checkpoint AND config_id = p_config;
        EXECUTE $q$
    INSERT INTO checkpoint_overlap (model, step, config_id, final_pairs, present, share,
                                    model_id, checkpoint_id)
    WITH final_pairs AS MATERIALIZED (
        SELECT s.layer, s.neuron, s.op, s.heuristic_id
        FROM neuron_op n
        JOIN neuron_score s ON s.model_id = n.model_id AND s.checkpoint_id = n.checkpoint_id
             AND s.config_id = n.config_id AND s.layer = n.layer AND s.neuron = n.neuron
             AND s.op = n.op
        WHERE n.model_id = $1 AND n.checkpoint_id = $3 AND n.config_id = $2 AND n.rank < $4
              AND s.model_id = $1 AND coalesce(s.implements, s.score >= (SELECT value FROM catalog_setting WHERE key = 'match_threshold'))),
    total AS (SELECT count(*) AS n FROM final_pairs)
    SELECT m.name, ck.step, $2, t.n, p.n, p.n::real / nullif(t.n, 0), $1, ck.checkpoint_id
    FROM (SELECT $5::integer AS checkpoint_id, $6::bigint AS step) ck
    CROSS JOIN total t
    JOIN model m ON m.id = $1
    CROSS JOIN LATERAL (
        SELECT count(*) AS n FROM final_pairs fp
        JOIN neuron_score s ON s.model_id = $1 AND s.checkpoint_id = ck.checkpoint_id
             AND s.config_id = $2 AND s.layer = fp.layer AND s.neuron = fp.neuron
             AND s.op = fp.op AND s.heuristic_id = fp.heuristic_id
        WHERE coalesce(s.implements, s.score >= (SELECT value FROM catalog_setting WHERE key = 'match_threshold'))) p
    WHERE t.n > 0$q$ USING p_model, p_config, v_final, v_k, p_checkpoint,
                                          v_step;
      END IF;
      RETURN 'folded';
    END $function$;

CREATE OR REPLACE FUNCTION public.score_bin(x real)
 RETURNS numeric
 LANGUAGE sql
 IMMUTABLE
AS $function$
      SELECT (floor(x::float8 * 20) / 20)::numeric(4, 2)
    $function$;

CREATE OR REPLACE FUNCTION public.wilson_high(k bigint, n bigint)
 RETURNS double precision
 LANGUAGE sql
 IMMUTABLE PARALLEL SAFE
AS $function$
        SELECT CASE WHEN n > 0 THEN
            ((k::float8 / n + 1.959964 ^ 2 / (2 * n))
             + 1.959964 * sqrt(k::float8 / n * (1 - k::float8 / n) / n
                                    + 1.959964 ^ 2 / (4 * n::float8 * n)))
            / (1 + 1.959964 ^ 2 / n) END
    $function$;

CREATE OR REPLACE FUNCTION public.wilson_low(k bigint, n bigint)
 RETURNS double precision
 LANGUAGE sql
 IMMUTABLE PARALLEL SAFE
AS $function$
        SELECT CASE WHEN n > 0 THEN
            ((k::float8 / n + 1.959964 ^ 2 / (2 * n))
             - 1.959964 * sqrt(k::float8 / n * (1 - k::float8 / n) / n
                                    + 1.959964 ^ 2 / (4 * n::float8 * n)))
            / (1 + 1.959964 ^ 2 / n) END
    $function$;

-- triggers
CREATE TRIGGER emergence_histogram_delete AFTER DELETE ON public.emergence_run REFERENCING OLD TABLE AS old_runs FOR EACH STATEMENT EXECUTE FUNCTION emergence_histogram_track();
CREATE TRIGGER emergence_histogram_insert AFTER INSERT ON public.emergence_run REFERENCING NEW TABLE AS new_runs FOR EACH STATEMENT EXECUTE FUNCTION emergence_histogram_track();
CREATE TRIGGER emergence_histogram_truncate AFTER TRUNCATE ON public.emergence_run FOR EACH STATEMENT EXECUTE FUNCTION emergence_histogram_track();
CREATE TRIGGER emergence_histogram_update AFTER UPDATE ON public.emergence_run REFERENCING OLD TABLE AS old_runs NEW TABLE AS new_runs FOR EACH STATEMENT EXECUTE FUNCTION emergence_histogram_track();

-- roles
-- role catalog_reader: login True, settings {default_transaction_read_only=on,idle_in_transaction_session_timeout=1min,idle_session_timeout=10min,statement_timeout=10s,temp_file_limit=1GB}
-- grants on schema public: {pg_database_owner=UC/pg_database_owner,=U/pg_database_owner,catalog_reader=U/pg_database_owner}
