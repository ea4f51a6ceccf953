--
-- PostgreSQL database dump
--

\restrict LBgrurDDx2KtOuXRJMoJyMaPRKYou9HkxA5Z6N0bm9fmt798PbpbgCiihAEPf6U

-- Dumped from database version 15.18 (Debian 15.18-0+deb12u1)
-- Dumped by pg_dump version 15.18 (Debian 15.18-0+deb12u1)

SET statement_timeout = 0;
SET lock_timeout = 0;
SET idle_in_transaction_session_timeout = 0;
SET client_encoding = 'UTF8';
SET standard_conforming_strings = on;
SELECT pg_catalog.set_config('search_path', '', false);
SET check_function_bodies = false;
SET xmloption = content;
SET client_min_messages = warning;
SET row_security = off;

SET default_tablespace = '';

SET default_table_access_method = heap;

--
-- Name: changelog; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.changelog (
    idx bigint NOT NULL,
    "time" bigint NOT NULL,
    type bigint NOT NULL,
    flags bigint DEFAULT 0 NOT NULL,
    target bigint NOT NULL,
    parent bigint DEFAULT 0 NOT NULL,
    name bytea NOT NULL,
    sparent bigint,
    sname bytea,
    uid bigint NOT NULL,
    gid bigint NOT NULL,
    client text NOT NULL,
    jobid text
);


--
-- Name: changelog_readers; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.changelog_readers (
    id bigint NOT NULL,
    mask bigint NOT NULL,
    cleared bigint DEFAULT 0 NOT NULL,
    registered bigint NOT NULL,
    last_used bigint NOT NULL,
    idle_ns bigint NOT NULL,
    state bigint DEFAULT 0 NOT NULL,
    ended bigint
);


--
-- Name: changelog_seq; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.changelog_seq (
    n bigint NOT NULL
);


--
-- Name: changelog_seq_n_seq; Type: SEQUENCE; Schema: public; Owner: -
--

CREATE SEQUENCE public.changelog_seq_n_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1;


--
-- Name: changelog_seq_n_seq; Type: SEQUENCE OWNED BY; Schema: public; Owner: -
--

ALTER SEQUENCE public.changelog_seq_n_seq OWNED BY public.changelog_seq.n;


--
-- Name: counters; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.counters (
    name text NOT NULL,
    value bigint NOT NULL
);


--
-- Name: dentries; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.dentries (
    id bigint NOT NULL,
    parent bigint NOT NULL,
    name bytea NOT NULL,
    ino bigint NOT NULL,
    kind bigint NOT NULL
);


--
-- Name: dentries_id_seq; Type: SEQUENCE; Schema: public; Owner: -
--

CREATE SEQUENCE public.dentries_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1;


--
-- Name: dentries_id_seq; Type: SEQUENCE OWNED BY; Schema: public; Owner: -
--

ALTER SEQUENCE public.dentries_id_seq OWNED BY public.dentries.id;


--
-- Name: inodes; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.inodes (
    ino bigint NOT NULL,
    kind bigint NOT NULL,
    perm bigint NOT NULL,
    uid bigint NOT NULL,
    gid bigint NOT NULL,
    nlink bigint NOT NULL,
    size bigint DEFAULT 0 NOT NULL,
    rdev bigint DEFAULT 0 NOT NULL,
    atime bigint NOT NULL,
    mtime bigint NOT NULL,
    ctime bigint NOT NULL,
    crtime bigint NOT NULL,
    projid bigint DEFAULT 0 NOT NULL,
    projinherit bigint DEFAULT 0 NOT NULL,
    data_version bigint DEFAULT 0 NOT NULL,
    stripe_size bigint DEFAULT 0 NOT NULL,
    stripe_targets text DEFAULT ''::text NOT NULL,
    def_stripe_count bigint DEFAULT 0 NOT NULL,
    def_stripe_size bigint DEFAULT 0 NOT NULL,
    parent bigint DEFAULT 0 NOT NULL,
    symlink bytea,
    orphan bigint DEFAULT 0 NOT NULL,
    allocated bigint DEFAULT 0 NOT NULL
);


--
-- Name: inodes_ino_seq; Type: SEQUENCE; Schema: public; Owner: -
--

CREATE SEQUENCE public.inodes_ino_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1;


--
-- Name: inodes_ino_seq; Type: SEQUENCE OWNED BY; Schema: public; Owner: -
--

ALTER SEQUENCE public.inodes_ino_seq OWNED BY public.inodes.ino;


--
-- Name: locks; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.locks (
    ino bigint NOT NULL,
    session bigint NOT NULL,
    owner bigint NOT NULL,
    flock bigint NOT NULL,
    typ bigint NOT NULL,
    start bigint NOT NULL,
    "end" bigint NOT NULL,
    pid bigint NOT NULL
);


--
-- Name: meta_info; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.meta_info (
    key text NOT NULL,
    value text NOT NULL
);


--
-- Name: open_files; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.open_files (
    ino bigint NOT NULL,
    session bigint NOT NULL,
    count bigint NOT NULL
);


--
-- Name: pcc_leases; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.pcc_leases (
    ino bigint NOT NULL,
    client text NOT NULL,
    generation bigint NOT NULL,
    dirty bigint DEFAULT 0 NOT NULL,
    acquired bigint NOT NULL,
    snapshot bigint DEFAULT 0 NOT NULL
);


--
-- Name: pcc_revokes; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.pcc_revokes (
    ino bigint NOT NULL,
    requester text NOT NULL,
    requested bigint NOT NULL,
    for_write bigint DEFAULT 1 NOT NULL,
    seq bigint DEFAULT 0 NOT NULL
);


--
-- Name: pcc_rules; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.pcc_rules (
    id bigint NOT NULL,
    mode text NOT NULL,
    client text,
    rule text NOT NULL,
    created bigint NOT NULL,
    quota bigint
);


--
-- Name: pcc_rules_id_seq; Type: SEQUENCE; Schema: public; Owner: -
--

CREATE SEQUENCE public.pcc_rules_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1;


--
-- Name: pcc_rules_id_seq; Type: SEQUENCE OWNED BY; Schema: public; Owner: -
--

ALTER SEQUENCE public.pcc_rules_id_seq OWNED BY public.pcc_rules.id;


--
-- Name: schema_version; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.schema_version (
    version bigint NOT NULL
);


--
-- Name: sessions; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.sessions (
    id bigint NOT NULL,
    client_name text NOT NULL,
    host text NOT NULL,
    pid bigint NOT NULL,
    mountpoint text NOT NULL,
    version text NOT NULL,
    started bigint NOT NULL,
    heartbeat bigint NOT NULL
);


--
-- Name: sessions_id_seq; Type: SEQUENCE; Schema: public; Owner: -
--

CREATE SEQUENCE public.sessions_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1;


--
-- Name: sessions_id_seq; Type: SEQUENCE OWNED BY; Schema: public; Owner: -
--

ALTER SEQUENCE public.sessions_id_seq OWNED BY public.sessions.id;


--
-- Name: slices; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.slices (
    seq bigint NOT NULL,
    ino bigint NOT NULL,
    chunk bigint NOT NULL,
    off bigint NOT NULL,
    len bigint NOT NULL,
    target bigint,
    obj bigint,
    obj_off bigint DEFAULT 0 NOT NULL,
    obj_size bigint DEFAULT 0 NOT NULL,
    inline bytea
);


--
-- Name: slices_seq_seq; Type: SEQUENCE; Schema: public; Owner: -
--

CREATE SEQUENCE public.slices_seq_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1;


--
-- Name: slices_seq_seq; Type: SEQUENCE OWNED BY; Schema: public; Owner: -
--

ALTER SEQUENCE public.slices_seq_seq OWNED BY public.slices.seq;


--
-- Name: targets; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.targets (
    id bigint NOT NULL,
    url text NOT NULL,
    capacity bigint DEFAULT 0 NOT NULL,
    used bigint DEFAULT 0 NOT NULL,
    objects bigint DEFAULT 0 NOT NULL
);


--
-- Name: trash; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.trash (
    id bigint NOT NULL,
    ino bigint NOT NULL,
    target bigint NOT NULL,
    obj bigint NOT NULL,
    len bigint NOT NULL,
    created bigint DEFAULT 0 NOT NULL
);


--
-- Name: trash_id_seq; Type: SEQUENCE; Schema: public; Owner: -
--

CREATE SEQUENCE public.trash_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1;


--
-- Name: trash_id_seq; Type: SEQUENCE OWNED BY; Schema: public; Owner: -
--

ALTER SEQUENCE public.trash_id_seq OWNED BY public.trash.id;


--
-- Name: worker_reports; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.worker_reports (
    session bigint NOT NULL,
    pos bigint NOT NULL,
    name text NOT NULL,
    state text NOT NULL,
    progress text NOT NULL,
    runs bigint NOT NULL,
    errors bigint NOT NULL,
    last_run bigint NOT NULL,
    last_error text,
    last_error_at bigint NOT NULL,
    reported bigint NOT NULL
);


--
-- Name: xattrs; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.xattrs (
    ino bigint NOT NULL,
    name bytea NOT NULL,
    value bytea NOT NULL
);


--
-- Name: changelog_seq n; Type: DEFAULT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.changelog_seq ALTER COLUMN n SET DEFAULT nextval('public.changelog_seq_n_seq'::regclass);


--
-- Name: dentries id; Type: DEFAULT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.dentries ALTER COLUMN id SET DEFAULT nextval('public.dentries_id_seq'::regclass);


--
-- Name: inodes ino; Type: DEFAULT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.inodes ALTER COLUMN ino SET DEFAULT nextval('public.inodes_ino_seq'::regclass);


--
-- Name: pcc_rules id; Type: DEFAULT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.pcc_rules ALTER COLUMN id SET DEFAULT nextval('public.pcc_rules_id_seq'::regclass);


--
-- Name: sessions id; Type: DEFAULT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.sessions ALTER COLUMN id SET DEFAULT nextval('public.sessions_id_seq'::regclass);


--
-- Name: slices seq; Type: DEFAULT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.slices ALTER COLUMN seq SET DEFAULT nextval('public.slices_seq_seq'::regclass);


--
-- Name: trash id; Type: DEFAULT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.trash ALTER COLUMN id SET DEFAULT nextval('public.trash_id_seq'::regclass);


--
-- Data for Name: changelog; Type: TABLE DATA; Schema: public; Owner: -
--



--
-- Data for Name: changelog_readers; Type: TABLE DATA; Schema: public; Owner: -
--



--
-- Data for Name: changelog_seq; Type: TABLE DATA; Schema: public; Owner: -
--



--
-- Data for Name: counters; Type: TABLE DATA; Schema: public; Owner: -
--

INSERT INTO public.counters VALUES ('pcc_generation', 0);
INSERT INTO public.counters VALUES ('next_object', 5);


--
-- Data for Name: dentries; Type: TABLE DATA; Schema: public; Owner: -
--

INSERT INTO public.dentries VALUES (1, 1, '\x646972', 2, 2);
INSERT INTO public.dentries VALUES (2, 2, '\x61', 3, 1);
INSERT INTO public.dentries VALUES (3, 1, '\x68617264', 3, 1);
INSERT INTO public.dentries VALUES (4, 1, '\x696e6c696e65', 4, 1);
INSERT INTO public.dentries VALUES (5, 1, '\x73796d', 5, 3);
INSERT INTO public.dentries VALUES (6, 2, '\x6669666f', 6, 4);
INSERT INTO public.dentries VALUES (7, 2, '\x7472756e63', 7, 1);
INSERT INTO public.dentries VALUES (8, 2, '\x737562', 8, 2);
INSERT INTO public.dentries VALUES (9, 8, '\x663030', 9, 1);
INSERT INTO public.dentries VALUES (10, 8, '\x663031', 10, 1);
INSERT INTO public.dentries VALUES (11, 8, '\x663032', 11, 1);
INSERT INTO public.dentries VALUES (12, 8, '\x663033', 12, 1);
INSERT INTO public.dentries VALUES (13, 8, '\x663034', 13, 1);
INSERT INTO public.dentries VALUES (14, 8, '\x663035', 14, 1);
INSERT INTO public.dentries VALUES (15, 8, '\x663036', 15, 1);
INSERT INTO public.dentries VALUES (16, 8, '\x663037', 16, 1);
INSERT INTO public.dentries VALUES (17, 8, '\x663038', 17, 1);
INSERT INTO public.dentries VALUES (18, 8, '\x663039', 18, 1);
INSERT INTO public.dentries VALUES (19, 8, '\x663130', 19, 1);
INSERT INTO public.dentries VALUES (20, 8, '\x663131', 20, 1);
INSERT INTO public.dentries VALUES (21, 8, '\x663132', 21, 1);
INSERT INTO public.dentries VALUES (22, 8, '\x663133', 22, 1);
INSERT INTO public.dentries VALUES (23, 8, '\x663134', 23, 1);
INSERT INTO public.dentries VALUES (24, 8, '\x663135', 24, 1);
INSERT INTO public.dentries VALUES (25, 8, '\x663136', 25, 1);
INSERT INTO public.dentries VALUES (26, 8, '\x663137', 26, 1);
INSERT INTO public.dentries VALUES (27, 8, '\x663138', 27, 1);
INSERT INTO public.dentries VALUES (28, 8, '\x663139', 28, 1);


--
-- Data for Name: inodes; Type: TABLE DATA; Schema: public; Owner: -
--

INSERT INTO public.inodes VALUES (15, 1, 420, 1000, 100, 1, 0, 0, 1795513738724800683, 1795513738724800683, 1795513738724800683, 1795513738724800683, 42, 0, 0, 0, '', 0, 0, 8, NULL, 0, 0);
INSERT INTO public.inodes VALUES (7, 1, 420, 1000, 100, 1, 100, 0, 1795513738715748260, 1795513738718188347, 1795513738718188347, 1795513738715748260, 42, 0, 2, 1048576, '1', 0, 0, 2, NULL, 0, 100);
INSERT INTO public.inodes VALUES (22, 1, 420, 1000, 100, 1, 0, 0, 1795513738729300240, 1795513738729300240, 1795513738729300240, 1795513738729300240, 42, 0, 0, 0, '', 0, 0, 8, NULL, 0, 0);
INSERT INTO public.inodes VALUES (2, 2, 493, 1000, 100, 3, 0, 0, 1795513738697322685, 1795513738720354833, 1795513738720354833, 1795513738697322685, 42, 1, 0, 0, '', 2, 4194304, 1, NULL, 0, 0);
INSERT INTO public.inodes VALUES (16, 1, 420, 1000, 100, 1, 0, 0, 1795513738725443422, 1795513738725443422, 1795513738725443422, 1795513738725443422, 42, 0, 0, 0, '', 0, 0, 8, NULL, 0, 0);
INSERT INTO public.inodes VALUES (3, 1, 416, 1000, 100, 2, 2097162, 0, 1795513738701654519, 1000000002, 1795513738710128802, 1795513738701654519, 42, 0, 2, 1048576, '1', 0, 0, 2, NULL, 0, 1510);
INSERT INTO public.inodes VALUES (9, 1, 420, 1000, 100, 1, 0, 0, 1795513738721052000, 1795513738721052000, 1795513738721052000, 1795513738721052000, 42, 0, 0, 0, '', 0, 0, 8, NULL, 0, 0);
INSERT INTO public.inodes VALUES (4, 1, 384, 1000, 100, 1, 5, 0, 1795513738711961552, 1000000003, 1000000003, 1795513738711961552, 0, 0, 1, 1048576, '1', 0, 0, 1, NULL, 0, 5);
INSERT INTO public.inodes VALUES (5, 3, 511, 1000, 100, 1, 5, 0, 1795513738713978975, 1795513738713978975, 1795513738713978975, 1795513738713978975, 0, 0, 0, 0, '', 0, 0, 1, '\x6469722f61', 0, 0);
INSERT INTO public.inodes VALUES (1, 2, 493, 0, 0, 3, 0, 0, 1795513738693884613, 1795513738713978975, 1795513738713978975, 1795513738693884613, 0, 0, 0, 0, '', 0, 0, 1, NULL, 0, 0);
INSERT INTO public.inodes VALUES (10, 1, 420, 1000, 100, 1, 0, 0, 1795513738721670594, 1795513738721670594, 1795513738721670594, 1795513738721670594, 42, 0, 0, 0, '', 0, 0, 8, NULL, 0, 0);
INSERT INTO public.inodes VALUES (6, 4, 420, 1000, 100, 1, 0, 0, 1795513738714873238, 1795513738714873238, 1795513738714873238, 1795513738714873238, 42, 0, 0, 0, '', 0, 0, 2, NULL, 0, 0);
INSERT INTO public.inodes VALUES (17, 1, 420, 1000, 100, 1, 0, 0, 1795513738726055238, 1795513738726055238, 1795513738726055238, 1795513738726055238, 42, 0, 0, 0, '', 0, 0, 8, NULL, 0, 0);
INSERT INTO public.inodes VALUES (11, 1, 420, 1000, 100, 1, 0, 0, 1795513738722285194, 1795513738722285194, 1795513738722285194, 1795513738722285194, 42, 0, 0, 0, '', 0, 0, 8, NULL, 0, 0);
INSERT INTO public.inodes VALUES (12, 1, 420, 1000, 100, 1, 0, 0, 1795513738722934320, 1795513738722934320, 1795513738722934320, 1795513738722934320, 42, 0, 0, 0, '', 0, 0, 8, NULL, 0, 0);
INSERT INTO public.inodes VALUES (13, 1, 420, 1000, 100, 1, 0, 0, 1795513738723528311, 1795513738723528311, 1795513738723528311, 1795513738723528311, 42, 0, 0, 0, '', 0, 0, 8, NULL, 0, 0);
INSERT INTO public.inodes VALUES (18, 1, 420, 1000, 100, 1, 0, 0, 1795513738726649619, 1795513738726649619, 1795513738726649619, 1795513738726649619, 42, 0, 0, 0, '', 0, 0, 8, NULL, 0, 0);
INSERT INTO public.inodes VALUES (14, 1, 420, 1000, 100, 1, 0, 0, 1795513738724144539, 1795513738724144539, 1795513738724144539, 1795513738724144539, 42, 0, 0, 0, '', 0, 0, 8, NULL, 0, 0);
INSERT INTO public.inodes VALUES (23, 1, 420, 1000, 100, 1, 0, 0, 1795513738729946380, 1795513738729946380, 1795513738729946380, 1795513738729946380, 42, 0, 0, 0, '', 0, 0, 8, NULL, 0, 0);
INSERT INTO public.inodes VALUES (19, 1, 420, 1000, 100, 1, 0, 0, 1795513738727345322, 1795513738727345322, 1795513738727345322, 1795513738727345322, 42, 0, 0, 0, '', 0, 0, 8, NULL, 0, 0);
INSERT INTO public.inodes VALUES (20, 1, 420, 1000, 100, 1, 0, 0, 1795513738728008694, 1795513738728008694, 1795513738728008694, 1795513738728008694, 42, 0, 0, 0, '', 0, 0, 8, NULL, 0, 0);
INSERT INTO public.inodes VALUES (27, 1, 420, 1000, 100, 1, 0, 0, 1795513738732649863, 1795513738732649863, 1795513738732649863, 1795513738732649863, 42, 0, 0, 0, '', 0, 0, 8, NULL, 0, 0);
INSERT INTO public.inodes VALUES (21, 1, 420, 1000, 100, 1, 0, 0, 1795513738728653439, 1795513738728653439, 1795513738728653439, 1795513738728653439, 42, 0, 0, 0, '', 0, 0, 8, NULL, 0, 0);
INSERT INTO public.inodes VALUES (24, 1, 420, 1000, 100, 1, 0, 0, 1795513738730613644, 1795513738730613644, 1795513738730613644, 1795513738730613644, 42, 0, 0, 0, '', 0, 0, 8, NULL, 0, 0);
INSERT INTO public.inodes VALUES (25, 1, 420, 1000, 100, 1, 0, 0, 1795513738731280747, 1795513738731280747, 1795513738731280747, 1795513738731280747, 42, 0, 0, 0, '', 0, 0, 8, NULL, 0, 0);
INSERT INTO public.inodes VALUES (26, 1, 420, 1000, 100, 1, 0, 0, 1795513738731967061, 1795513738731967061, 1795513738731967061, 1795513738731967061, 42, 0, 0, 0, '', 0, 0, 8, NULL, 0, 0);
INSERT INTO public.inodes VALUES (28, 1, 420, 1000, 100, 1, 0, 0, 1795513738733315822, 1795513738733315822, 1795513738733315822, 1795513738733315822, 42, 0, 0, 0, '', 0, 0, 8, NULL, 0, 0);
INSERT INTO public.inodes VALUES (8, 2, 448, 1000, 100, 2, 0, 0, 1795513738720354833, 1795513738733315822, 1795513738733315822, 1795513738720354833, 42, 1, 0, 0, '', 0, 0, 2, NULL, 0, 0);


--
-- Data for Name: locks; Type: TABLE DATA; Schema: public; Owner: -
--



--
-- Data for Name: meta_info; Type: TABLE DATA; Schema: public; Owner: -
--

INSERT INTO public.meta_info VALUES ('name', 'conformance');
INSERT INTO public.meta_info VALUES ('uuid', '106da160-434e-414f-af45-2981a2587ed4');
INSERT INTO public.meta_info VALUES ('stripe_count', '1');
INSERT INTO public.meta_info VALUES ('stripe_size', '1048576');
INSERT INTO public.meta_info VALUES ('inline_threshold', '65536');
INSERT INTO public.meta_info VALUES ('created', '1795513738693884613');


--
-- Data for Name: open_files; Type: TABLE DATA; Schema: public; Owner: -
--



--
-- Data for Name: pcc_leases; Type: TABLE DATA; Schema: public; Owner: -
--



--
-- Data for Name: pcc_revokes; Type: TABLE DATA; Schema: public; Owner: -
--



--
-- Data for Name: pcc_rules; Type: TABLE DATA; Schema: public; Owner: -
--

INSERT INTO public.pcc_rules VALUES (1, 'rw', 'client-a', 'projid={42}', 1795513738733810001, 1073741824);


--
-- Data for Name: schema_version; Type: TABLE DATA; Schema: public; Owner: -
--

INSERT INTO public.schema_version VALUES (7);


--
-- Data for Name: sessions; Type: TABLE DATA; Schema: public; Owner: -
--



--
-- Data for Name: slices; Type: TABLE DATA; Schema: public; Owner: -
--

INSERT INTO public.slices VALUES (1, 3, 0, 0, 1000, 1, 1, 0, 1000, NULL);
INSERT INTO public.slices VALUES (2, 3, 0, 500, 1000, 1, 2, 0, 1000, NULL);
INSERT INTO public.slices VALUES (3, 3, 2, 0, 10, 1, 3, 0, 10, NULL);
INSERT INTO public.slices VALUES (4, 4, 0, 0, 5, NULL, NULL, 0, 0, '\x68656c6c6f');
INSERT INTO public.slices VALUES (5, 7, 0, 0, 4096, 1, 4, 0, 4096, NULL);
INSERT INTO public.slices VALUES (6, 7, 0, 100, 1048476, NULL, NULL, 0, 0, NULL);


--
-- Data for Name: targets; Type: TABLE DATA; Schema: public; Owner: -
--

INSERT INTO public.targets VALUES (0, 'file:///tmp/ost0', 0, 0, 0);
INSERT INTO public.targets VALUES (1, 'file:///tmp/ost1', 0, 6106, 4);


--
-- Data for Name: trash; Type: TABLE DATA; Schema: public; Owner: -
--



--
-- Data for Name: worker_reports; Type: TABLE DATA; Schema: public; Owner: -
--



--
-- Data for Name: xattrs; Type: TABLE DATA; Schema: public; Owner: -
--

INSERT INTO public.xattrs VALUES (3, '\x757365722e636f6c6f72', '\x626c7565');
INSERT INTO public.xattrs VALUES (3, '\x757365722e656d707479', '\x');


--
-- Name: changelog_seq_n_seq; Type: SEQUENCE SET; Schema: public; Owner: -
--

SELECT pg_catalog.setval('public.changelog_seq_n_seq', 1, false);


--
-- Name: dentries_id_seq; Type: SEQUENCE SET; Schema: public; Owner: -
--

SELECT pg_catalog.setval('public.dentries_id_seq', 28, true);


--
-- Name: inodes_ino_seq; Type: SEQUENCE SET; Schema: public; Owner: -
--

SELECT pg_catalog.setval('public.inodes_ino_seq', 28, true);


--
-- Name: pcc_rules_id_seq; Type: SEQUENCE SET; Schema: public; Owner: -
--

SELECT pg_catalog.setval('public.pcc_rules_id_seq', 1, true);


--
-- Name: sessions_id_seq; Type: SEQUENCE SET; Schema: public; Owner: -
--

SELECT pg_catalog.setval('public.sessions_id_seq', 1, false);


--
-- Name: slices_seq_seq; Type: SEQUENCE SET; Schema: public; Owner: -
--

SELECT pg_catalog.setval('public.slices_seq_seq', 6, true);


--
-- Name: trash_id_seq; Type: SEQUENCE SET; Schema: public; Owner: -
--

SELECT pg_catalog.setval('public.trash_id_seq', 1, false);


--
-- Name: changelog changelog_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.changelog
    ADD CONSTRAINT changelog_pkey PRIMARY KEY (idx);


--
-- Name: changelog_readers changelog_readers_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.changelog_readers
    ADD CONSTRAINT changelog_readers_pkey PRIMARY KEY (id);


--
-- Name: changelog_seq changelog_seq_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.changelog_seq
    ADD CONSTRAINT changelog_seq_pkey PRIMARY KEY (n);


--
-- Name: counters counters_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.counters
    ADD CONSTRAINT counters_pkey PRIMARY KEY (name);


--
-- Name: dentries dentries_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.dentries
    ADD CONSTRAINT dentries_pkey PRIMARY KEY (id);


--
-- Name: inodes inodes_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.inodes
    ADD CONSTRAINT inodes_pkey PRIMARY KEY (ino);


--
-- Name: meta_info meta_info_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.meta_info
    ADD CONSTRAINT meta_info_pkey PRIMARY KEY (key);


--
-- Name: open_files open_files_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.open_files
    ADD CONSTRAINT open_files_pkey PRIMARY KEY (ino, session);


--
-- Name: pcc_leases pcc_leases_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.pcc_leases
    ADD CONSTRAINT pcc_leases_pkey PRIMARY KEY (ino);


--
-- Name: pcc_revokes pcc_revokes_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.pcc_revokes
    ADD CONSTRAINT pcc_revokes_pkey PRIMARY KEY (ino);


--
-- Name: pcc_rules pcc_rules_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.pcc_rules
    ADD CONSTRAINT pcc_rules_pkey PRIMARY KEY (id);


--
-- Name: sessions sessions_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.sessions
    ADD CONSTRAINT sessions_pkey PRIMARY KEY (id);


--
-- Name: slices slices_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.slices
    ADD CONSTRAINT slices_pkey PRIMARY KEY (seq);


--
-- Name: targets targets_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.targets
    ADD CONSTRAINT targets_pkey PRIMARY KEY (id);


--
-- Name: trash trash_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.trash
    ADD CONSTRAINT trash_pkey PRIMARY KEY (id);


--
-- Name: worker_reports worker_reports_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.worker_reports
    ADD CONSTRAINT worker_reports_pkey PRIMARY KEY (session, pos);


--
-- Name: xattrs xattrs_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.xattrs
    ADD CONSTRAINT xattrs_pkey PRIMARY KEY (ino, name);


--
-- Name: dentries_cursor; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX dentries_cursor ON public.dentries USING btree (parent, id);


--
-- Name: dentries_name; Type: INDEX; Schema: public; Owner: -
--

CREATE UNIQUE INDEX dentries_name ON public.dentries USING btree (parent, name);


--
-- Name: inodes_grace; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX inodes_grace ON public.inodes USING btree (ctime) WHERE (orphan = 2);


--
-- Name: locks_ino; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX locks_ino ON public.locks USING btree (ino);


--
-- Name: open_files_session; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX open_files_session ON public.open_files USING btree (session);


--
-- Name: pcc_leases_client; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX pcc_leases_client ON public.pcc_leases USING btree (client);


--
-- Name: slices_chunk; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX slices_chunk ON public.slices USING btree (ino, chunk, seq);


--
-- Name: slices_obj; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX slices_obj ON public.slices USING btree (obj) WHERE (obj IS NOT NULL);


--
-- PostgreSQL database dump complete
--

\unrestrict LBgrurDDx2KtOuXRJMoJyMaPRKYou9HkxA5Z6N0bm9fmt798PbpbgCiihAEPf6U

