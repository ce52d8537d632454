import java.io.File;
import java.io.FileOutputStream;
import java.io.IOException;
import java.io.OutputStream;
import java.lang.reflect.Field;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.StandardCopyOption;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.TimeUnit;

import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.service.Service;
import org.apache.hadoop.yarn.api.records.ApplicationAttemptReport;
import org.apache.hadoop.yarn.api.records.ApplicationId;
import org.apache.hadoop.yarn.api.records.ApplicationReport;
import org.apache.hadoop.yarn.api.records.ContainerReport;
import org.apache.hadoop.yarn.client.api.YarnClient;
import org.apache.hadoop.yarn.conf.YarnConfiguration;
import org.apache.hadoop.metrics2.lib.DefaultMetricsSystem;
import org.apache.hadoop.yarn.server.resourcemanager.ResourceManager;
import org.apache.hadoop.yarn.util.resource.ResourceUtils;
import org.apache.hadoop.yarn.server.nodemanager.NodeManager;

/**
 * A single-node YARN for the job's tests and for rehearsing an EMR step: one
 * ResourceManager and N NodeManagers that launch real containers and talk to it
 * over RPC, with physical-memory enforcement on and virtual-memory checks off,
 * as on EMR. Started in the background by demo/yarn_local.py (`make yarn-up`).
 *
 * <p>The server classes come from hadoop-client-minicluster, the jar that holds
 * MiniYARNCluster; that class itself is not used because it fixes every
 * NodeManager at 4096 MB and turns its memory checks off, which is the one
 * behaviour of YARN this cluster is for.
 *
 * <p>Arguments: the state folder (.yarn), the number of NodeManagers, each one's
 * memory in MB and vcores, then yarn-site settings as KEY=VALUE. It writes STATE/conf/yarn-site.xml and core-site.xml
 * (the client configuration, HADOOP_CONF_DIR) and STATE/state.properties (its
 * pid, the ResourceManager's RPC and web addresses, each NodeManager's node id,
 * web port and whether it runs), then serves until SIGTERM. Applications are
 * reported and killed as on any YARN: the ResourceManager's REST API and UI,
 * or the `yarn` command (.yarn/bin/yarn). On request, it does what the tests
 * need and YARN has no API for here: a file STATE/control/stop-node-I stops
 * NodeManager I (its containers are killed and it leaves the cluster, as a
 * lost node does), and report-app-ID writes what `yarn application -status ID`
 * and the attempts' and containers' listings say to STATE/reports/ID.properties
 * (the REST API's JSON records are of no use here: hadoop-client-minicluster
 * relocates JAXB but not the annotations of YARN's records, so Jersey writes
 * them field-less). Each request file is deleted once done; its outcome is in
 * the state file.
 */
public final class LocalYarn {
    private static final long POLL_MS = 100;
    private static final String HOST = "127.0.0.1";

    private LocalYarn() {
    }

    public static void main(String[] args) throws Exception {
        File state = new File(args[0]).getAbsoluteFile();
        int nodes = Integer.parseInt(args[1]);
        int nodeMb = Integer.parseInt(args[2]);
        int nodeVcores = Integer.parseInt(args[3]);

        YarnConfiguration conf = new YarnConfiguration();
        for (String address : new String[] {YarnConfiguration.RM_ADDRESS, YarnConfiguration.RM_ADMIN_ADDRESS,
            YarnConfiguration.RM_SCHEDULER_ADDRESS, YarnConfiguration.RM_RESOURCE_TRACKER_ADDRESS}) {
            conf.set(address, HOST + ":0");
        }
        conf.set(YarnConfiguration.RM_WEBAPP_ADDRESS, HOST + ":0");
        conf.setBoolean(YarnConfiguration.NM_PMEM_CHECK_ENABLED, true);
        conf.setBoolean(YarnConfiguration.NM_VMEM_CHECK_ENABLED, false);
        // The check that kills a container "for exceeding physical memory limits" polls each
        // container's process tree; Hadoop 3.3 skips it while cgroups' strict enforcement is
        // on, which is YARN's default even on a node with no cgroups, like this one.
        conf.setBoolean(YarnConfiguration.NM_MEMORY_RESOURCE_ENFORCED, false);
        conf.setLong(YarnConfiguration.NM_CONTAINER_MON_INTERVAL_MS, 1000);
        conf.setInt(YarnConfiguration.NM_PMEM_MB, nodeMb);
        conf.setInt(YarnConfiguration.NM_VCORES, nodeVcores);
        // Containers in steps of 32 MB, as EMR's yarn-site has it (YARN's own default is 1024): a container's
        // limit is then what its Spark settings ask for, to within 32 MB.
        conf.setInt(YarnConfiguration.RM_SCHEDULER_MINIMUM_ALLOCATION_MB, 32);
        conf.setInt(YarnConfiguration.RM_SCHEDULER_MAXIMUM_ALLOCATION_MB, nodeMb);
        conf.setInt(YarnConfiguration.RM_SCHEDULER_MAXIMUM_ALLOCATION_VCORES, nodeVcores);
        // A node that stops heartbeating is lost after 20 s, not YARN's 10 minutes.
        conf.setLong(YarnConfiguration.RM_NM_EXPIRY_INTERVAL_MS, 20_000);
        conf.setBoolean(YarnConfiguration.LOG_AGGREGATION_ENABLED, false);
        // The disk check would mark a node unhealthy on a nearly full disk.
        conf.set("yarn.nodemanager.disk-health-checker.max-disk-utilization-per-disk-percentage", "100.0");
        // capacity-scheduler.xml is not in hadoop-client-minicluster (as Spark's BaseYarnClusterSuite does).
        conf.set("yarn.scheduler.capacity.root.queues", "default");
        conf.setInt("yarn.scheduler.capacity.root.default.capacity", 100);
        conf.setFloat("yarn.scheduler.capacity.root.default.user-limit-factor", 1);
        conf.setInt("yarn.scheduler.capacity.root.default.maximum-capacity", 100);
        conf.set("yarn.scheduler.capacity.root.default.state", "RUNNING");
        conf.set("yarn.scheduler.capacity.root.default.acl_submit_applications", "*");
        conf.set("yarn.scheduler.capacity.root.default.acl_administer_queue", "*");
        conf.setInt("yarn.scheduler.capacity.node-locality-delay", -1);
        // Both of a Spark application's AM attempts (spark.yarn.maxAppAttempts 2), as on EMR.
        conf.setInt(YarnConfiguration.RM_AM_MAX_ATTEMPTS, 2);
        // Then the cluster's own yarn-site settings, KEY=VALUE (conf/emr.yaml's yarn-site classification).
        for (int i = 4; i < args.length; i++) {
            String[] setting = args[i].split("=", 2);
            conf.set(setting[0], setting[1]);
        }

        // The schedulers read the allocation limits from resource types that Hadoop caches per JVM,
        // from the first configuration it saw (YARN's defaults: 1024 MB at least): read them from this one.
        ResourceUtils.resetResourceTypes(conf);
        // Several NodeManagers in one JVM register metrics sources of the same names.
        DefaultMetricsSystem.setMiniClusterMode(true);
        LateWebResourceManager rm = new LateWebResourceManager();
        rm.init(conf);
        rm.start();
        // The RM's services write the ports they bound (":0" asked for any) back into its configuration.
        Configuration live = rm.getConfig();
        NodeManager[] cluster = new NodeManager[nodes];
        File work = new File(state, "nodes");
        for (int i = 0; i < nodes; i++) {
            YarnConfiguration nmConf = new YarnConfiguration(live);
            File local = new File(work, "nm-" + i + "/local");
            File logs = new File(work, "nm-" + i + "/logs");
            local.mkdirs();
            logs.mkdirs();
            nmConf.set(YarnConfiguration.NM_LOCAL_DIRS, local.getPath());
            nmConf.set(YarnConfiguration.NM_LOG_DIRS, logs.getPath());
            nmConf.set(YarnConfiguration.NM_ADDRESS, HOST + ":0");
            nmConf.set(YarnConfiguration.NM_LOCALIZER_ADDRESS, HOST + ":0");
            nmConf.set(YarnConfiguration.NM_WEBAPP_ADDRESS, HOST + ":0");
            nmConf.set(YarnConfiguration.NM_COLLECTOR_SERVICE_ADDRESS, HOST + ":0");
            cluster[i] = new NodeManager();
            cluster[i].init(nmConf);
            cluster[i].start();
        }
        Runtime.getRuntime().addShutdownHook(new Thread(() -> {
            for (NodeManager nm : cluster) {
                nm.stop();
            }
            rm.stop();
        }, "local-yarn-stop"));
        long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(60);
        while (rm.getRMContext().getRMNodes().size() < nodes) {
            if (System.nanoTime() > deadline) {
                throw new IllegalStateException("the NodeManagers did not register with the ResourceManager in 60 s");
            }
            Thread.sleep(POLL_MS);
        }

        // The ResourceManager's web UI and REST API last, once every NodeManager's web server runs (see
        // LateWebResourceManager), at the address the client configuration then names.
        int webPort = rm.startWebAppLast();
        live.set(YarnConfiguration.RM_WEBAPP_ADDRESS, HOST + ":" + webPort);

        File confDir = new File(state, "conf");
        confDir.mkdirs();
        writeXml(live, new File(confDir, "yarn-site.xml"));
        Configuration core = new Configuration(false);
        core.set("fs.defaultFS", "file:///");
        writeXml(core, new File(confDir, "core-site.xml"));

        File control = new File(state, "control");
        control.mkdirs();
        YarnClient client = YarnClient.createYarnClient();
        client.init(live);
        client.start();
        List<String> notes = new ArrayList<>();
        writeState(state, live, cluster, nodes, nodeMb, nodeVcores, notes);
        while (true) {
            File[] requests = control.listFiles();
            if (requests != null) {
                for (File request : requests) {
                    notes.add(serve(request.getName(), cluster, client, state));
                    // The outcome first: the request's file going is the caller's sign that it is there.
                    writeState(state, live, cluster, nodes, nodeMb, nodeVcores, notes);
                    Files.deleteIfExists(request.toPath());
                }
            }
            Thread.sleep(POLL_MS);
        }
    }

    private static String serve(String request, NodeManager[] cluster, YarnClient client, File state) {
        try {
            if (request.startsWith("report-app-")) {
                String id = request.substring("report-app-".length());
                report(client, ApplicationId.fromString(id), new File(state, "reports/" + id + ".properties"));
                return request + " done";
            }
            if (request.startsWith("stop-node-")) {
                int index = Integer.parseInt(request.substring("stop-node-".length()));
                cluster[index].stop();
                return request + " done";
            }
            return request + " unknown";
        } catch (Exception e) {
            return request + " failed: " + e.toString().replace('\n', ' ');
        }
    }

    /** What `yarn application -status` and `yarn applicationattempt -list` say of an application, as properties. */
    private static void report(YarnClient client, ApplicationId id, File file) throws Exception {
        ApplicationReport app = client.getApplicationReport(id);
        StringBuilder out = new StringBuilder();
        out.append("state=").append(app.getYarnApplicationState()).append('\n');
        out.append("final_status=").append(app.getFinalApplicationStatus()).append('\n');
        out.append("diagnostics=").append(oneLine(app.getDiagnostics())).append('\n');
        out.append("current_attempt=").append(app.getCurrentApplicationAttemptId()).append('\n');
        List<ApplicationAttemptReport> attempts = client.getApplicationAttempts(id);
        out.append("attempts=").append(attempts.size()).append('\n');
        for (ApplicationAttemptReport attempt : attempts) {
            String prefix = "attempt." + attempt.getApplicationAttemptId().getAttemptId() + ".";
            out.append(prefix).append("state=").append(attempt.getYarnApplicationAttemptState()).append('\n');
            out.append(prefix).append("am_container=").append(attempt.getAMContainerId()).append('\n');
            out.append(prefix).append("diagnostics=").append(oneLine(attempt.getDiagnostics())).append('\n');
        }
        if (!app.getYarnApplicationState().toString().matches("FINISHED|FAILED|KILLED")) {
            for (ContainerReport container : client.getContainers(app.getCurrentApplicationAttemptId())) {
                String prefix = "container." + container.getContainerId() + ".";
                out.append(prefix).append("node=").append(container.getAssignedNode()).append('\n');
                out.append(prefix).append("memory_mb=").append(container.getAllocatedResource().getMemorySize())
                        .append('\n');
            }
        }
        file.getParentFile().mkdirs();
        File partial = new File(file.getPath() + ".partial");
        Files.write(partial.toPath(), out.toString().getBytes(StandardCharsets.UTF_8));
        Files.move(partial.toPath(), file.toPath(), StandardCopyOption.REPLACE_EXISTING,
                StandardCopyOption.ATOMIC_MOVE);
    }

    private static String oneLine(String text) {
        return text == null ? "" : text.replace('\n', ' ').replace('\r', ' ');
    }

    private static void writeXml(Configuration conf, File file) throws IOException {
        File partial = new File(file.getPath() + ".partial");
        try (OutputStream out = new FileOutputStream(partial)) {
            conf.writeXml(out);
        }
        Files.move(partial.toPath(), file.toPath(), StandardCopyOption.REPLACE_EXISTING,
                StandardCopyOption.ATOMIC_MOVE);
    }

    private static void writeState(File state, Configuration live, NodeManager[] cluster, int nodes, int nodeMb, int nodeVcores,
                                   List<String> notes) throws IOException {
        StringBuilder out = new StringBuilder();
        out.append("pid=").append(ProcessHandle.current().pid()).append('\n');
        out.append("rm.address=").append(live.get(YarnConfiguration.RM_ADDRESS)).append('\n');
        out.append("rm.web=").append(live.get(YarnConfiguration.RM_WEBAPP_ADDRESS)).append('\n');
        out.append("nodes=").append(nodes).append('\n');
        out.append("node.memory_mb=").append(nodeMb).append('\n');
        out.append("node.vcores=").append(nodeVcores).append('\n');
        for (int i = 0; i < nodes; i++) {
            NodeManager nm = cluster[i];
            String prefix = "node." + i + ".";
            out.append(prefix).append("id=").append(nm.getNMContext().getNodeId()).append('\n');
            out.append(prefix).append("http=").append(nm.getNMContext().getHttpPort()).append('\n');
            out.append(prefix).append("running=").append(nm.getServiceState() == Service.STATE.STARTED)
                    .append('\n');
            out.append(prefix).append("log_dirs=").append(nm.getConfig().get(YarnConfiguration.NM_LOG_DIRS))
                    .append('\n');
        }
        for (int i = 0; i < notes.size(); i++) {
            out.append("request.").append(i).append('=').append(notes.get(i)).append('\n');
        }
        File partial = new File(state, "state.properties.partial");
        Files.write(partial.toPath(), out.toString().getBytes(StandardCharsets.UTF_8));
        Files.move(partial.toPath(), new File(state, "state.properties").toPath(),
                StandardCopyOption.REPLACE_EXISTING, StandardCopyOption.ATOMIC_MOVE);
    }

    /**
     * A ResourceManager whose web application starts when asked, after the NodeManagers'.
     *
     * <p>Hadoop's web applications route requests through Guice's GuiceFilter, whose request
     * pipeline is static: in one JVM the last web application started serves every web port (Guice
     * logs "Multiple Servlet injectors detected"). Started last, the ResourceManager's is the one
     * that answers, on its own port, as on EMR's master: its UI and REST API
     * (/ws/v1/cluster/...). The NodeManagers' ports then answer with it too.
     */
    static final class LateWebResourceManager extends ResourceManager {
        private boolean webAsked;

        @Override
        protected void startWepApp() {
            if (webAsked) {
                super.startWepApp();
            }
        }

        /** Start the web application now; the port it bound. */
        int startWebAppLast() throws ReflectiveOperationException {
            webAsked = true;
            startWepApp();
            // ResourceManager keeps its WebApp private; WebApp.port() is public.
            Field field = ResourceManager.class.getDeclaredField("webApp");
            field.setAccessible(true);
            Object webApp = field.get(this);
            return (Integer) webApp.getClass().getMethod("port").invoke(webApp);
        }
    }
}
